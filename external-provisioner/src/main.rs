//! `external-provisioner`: the command line; everything else lives in the library.

fn main() {
    external_provisioner::entry::main(std::env::args_os());
}
