//! Values every layer uses: interned strings and lists, upstream's name templates, quantities,
//! access modes, collections that give back a burst's capacity.

pub mod accessmodes;
pub mod atom;
pub mod names;
pub mod quantity;
pub mod shrink;
pub mod version;
