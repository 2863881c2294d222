//! `livenessprobe`: the command line; everything else lives in the library.

fn main() {
    livenessprobe::entry::main(std::env::args_os());
}
