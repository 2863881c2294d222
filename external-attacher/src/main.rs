//! `external-attacher`: the command line; everything else lives in the library.

fn main() {
    external_attacher::entry::main(std::env::args_os());
}
