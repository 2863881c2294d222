//! `csi-snapshotter`: the command line; everything else lives in the library.

fn main() {
    external_snapshotter::entry::main(std::env::args_os());
}
