//! The multi-call binary `csi-sidecars`: one image for drivers that want all sidecars from it.
//! The sidecar is chosen by the name the binary is called by (a link named `csi-provisioner`
//! runs the provisioner, as busybox does) or by the first argument
//! (`csi-sidecars provisioner --csi-address=…`); everything after it is the sidecar's own
//! command line. With flags instead of a sidecar's name (`csi-sidecars --controllers=…`) it
//! runs several controllers in one process; see [`aio`].

pub mod aio;
pub mod registry;

use std::ffi::{OsStr, OsString};

use registry::{Entry, REGISTRY};

/// What a command line asks of the multi-call binary.
#[derive(Debug, PartialEq, Eq)]
pub enum Call {
    /// Run a sidecar with this command line.
    Run(&'static Entry, Vec<OsString>),
    /// Run the controllers `--controllers` lists, in one process (the flags, without the
    /// program name).
    AllInOne(Vec<String>),
    /// Print the usage (`--help`, `-h`, `help` or nothing).
    Usage,
    /// Neither the program name nor the first argument names a sidecar.
    Unknown(String),
}

/// The program name without its folder (either separator, whatever the platform) and its
/// `.exe`.
fn program_name(arg0: &OsStr) -> String {
    let path = arg0.to_string_lossy();
    let name = path.rsplit(['/', '\\']).next().unwrap_or_default();
    name.strip_suffix(".exe").unwrap_or(name).to_string()
}

/// Decides from the command line which sidecar to run.
pub fn dispatch(args: Vec<OsString>) -> Call {
    let mut args = args.into_iter();
    let arg0 = args.next().unwrap_or_default();
    if let Some(sidecar) = Entry::named(&program_name(&arg0)) {
        return Call::Run(sidecar, std::iter::once(arg0).chain(args).collect());
    }
    let Some(first) = args.next() else {
        return Call::Usage;
    };
    let first = first.to_string_lossy().into_owned();
    match first.as_str() {
        "-h" | "--help" | "help" => Call::Usage,
        flag if flag.starts_with('-') => Call::AllInOne(
            std::iter::once(first.clone())
                .chain(args.map(|a| a.to_string_lossy().into_owned()))
                .collect(),
        ),
        name => match Entry::named(name) {
            // The sidecar sees its own binary's name as its program name.
            Some(sidecar) => Call::Run(
                sidecar,
                std::iter::once(OsString::from(sidecar.binary()))
                    .chain(args)
                    .collect(),
            ),
            None => Call::Unknown(name.to_string()),
        },
    }
}

/// The usage text.
pub fn usage() -> String {
    let mut text = String::from(
        "Usage: csi-sidecars SIDECAR [flags of the sidecar]\n   or: a link named after a sidecar's binary\n\nSidecars:\n",
    );
    for sidecar in &REGISTRY {
        text.push_str(&format!("  {}\n", sidecar.names().join(", ")));
    }
    text.push_str("\n`csi-sidecars SIDECAR --help` lists the sidecar's flags.\n\n");
    text.push_str(&aio::help());
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::entry;

    fn args(items: &[&str]) -> Vec<OsString> {
        items.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_first_argument_names_the_sidecar() {
        assert_eq!(
            dispatch(args(&["csi-sidecars", "provisioner", "--csi-address=/s"])),
            Call::Run(
                entry("provisioner"),
                args(&["csi-provisioner", "--csi-address=/s"])
            )
        );
        assert_eq!(
            dispatch(args(&[
                "/bin/csi-sidecars",
                "csi-node-driver-registrar",
                "-v",
                "5"
            ])),
            Call::Run(
                entry("node-driver-registrar"),
                args(&["csi-node-driver-registrar", "-v", "5"])
            )
        );
        assert_eq!(
            dispatch(args(&["csi-sidecars", "external-attacher"])),
            Call::Run(entry("attacher"), args(&["csi-attacher"]))
        );
    }

    #[test]
    fn the_program_name_names_the_sidecar() {
        assert_eq!(
            dispatch(args(&["/usr/bin/livenessprobe", "--probe-timeout=3s"])),
            Call::Run(
                entry("livenessprobe"),
                args(&["/usr/bin/livenessprobe", "--probe-timeout=3s"])
            )
        );
        assert_eq!(
            dispatch(args(&["C:\\csi-attacher.exe", "--help"])).clone_sidecar(),
            Some(entry("attacher"))
        );
    }

    #[test]
    fn usage_and_unknown_names() {
        assert_eq!(dispatch(args(&["csi-sidecars"])), Call::Usage);
        assert_eq!(dispatch(args(&["csi-sidecars", "--help"])), Call::Usage);
        assert_eq!(
            dispatch(args(&["csi-sidecars", "volume-populator"])),
            Call::Unknown("volume-populator".into())
        );
        for sidecar in &REGISTRY {
            assert!(usage().contains(sidecar.binary()));
        }
    }

    impl Call {
        fn clone_sidecar(&self) -> Option<&'static Entry> {
            match self {
                Call::Run(sidecar, _) => Some(sidecar),
                _ => None,
            }
        }
    }
}
