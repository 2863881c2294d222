//! What the provisioner records in the intent journal (`sidecar_kit::journal`) before its first
//! CreateVolume for a claim: the claim, the whole request without secret values, where the
//! secrets come from, and the PV to write. After a restart or a change of leader, every
//! recorded intent is driven to a final state (the PV written, or the volume deleted when the
//! claim is gone) and only then forgotten, so a kill in the middle of a CreateVolume never
//! leaks a volume.

use serde::{Deserialize, Serialize};
use sidecar_kit::journal::Owner;

use crate::decide::Prepared;
use crate::model::Claim;

pub use sidecar_kit::journal::{Entries, Journal, JournalError, Location, decode, journal_name};

/// One unfinished provisioning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    pub claim: Claim,
    pub class: String,
    pub prepared: Prepared,
}

/// How the provisioner's journal speaks of itself.
pub const OWNER: Owner = Owner {
    sidecar: "the provisioner",
    risk: "a restart during a CreateVolume may then leak a volume",
};
