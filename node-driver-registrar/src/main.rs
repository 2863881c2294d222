//! `node-driver-registrar`: the command line; everything else lives in the library.

fn main() {
    node_driver_registrar::entry::main(std::env::args_os());
}
