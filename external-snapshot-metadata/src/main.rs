fn main() {
    sidecar_kit::runtime::main::<external_snapshot_metadata::app::SnapshotMetadata>(
        std::env::args_os(),
    );
}
