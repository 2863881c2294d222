//! `csi-sidecars`: the command line; the dispatch lives in the library.

use csi_sidecars::{Call, dispatch, usage};

fn main() {
    match dispatch(std::env::args_os().collect()) {
        Call::Run(sidecar, args) => sidecar.run(args),
        Call::AllInOne(args) => csi_sidecars::aio::main(args),
        Call::Usage => print!("{}", usage()),
        Call::Unknown(name) => {
            eprint!("csi-sidecars: unknown sidecar {name:?}\n\n{}", usage());
            std::process::exit(2);
        }
    }
}
