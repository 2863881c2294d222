//! `csi-resizer`: the command line; everything else lives in the library.

fn main() {
    external_resizer::entry::main(std::env::args_os());
}
