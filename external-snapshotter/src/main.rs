//! `external-snapshotter`: the command line; everything else lives in the library and the sidecar runtime.

fn main() {
    sidecar_kit::runtime::main::<external_snapshotter::app::Snapshotter>(std::env::args_os());
}
