//! The `maintenance.nvidia.com/v1alpha1` API: `NodeMaintenance` and `MaintenanceOperatorConfig`.
//!
//! Field for field compatible with the NVIDIA Maintenance Operator, so existing requestors and
//! manifests work unchanged. Optional fields are `Option` so that explicit values such as
//! `cordon: false` or `timeoutSeconds: 0` survive a round trip through the operator.

mod config;
mod gates;
mod int_or_percent;
mod node_maintenance;
mod notifications;

pub use config::*;
pub use gates::*;
pub use int_or_percent::*;
pub use node_maintenance::*;
pub use notifications::*;

/// The API group of every type in this crate.
pub const GROUP: &str = "maintenance.nvidia.com";
/// The API version of every type in this crate.
pub const VERSION: &str = "v1alpha1";

/// The CRD manifests of this API as one multi-document YAML file (what `crdgen` writes).
pub fn crd_yaml() -> Result<String, serde_norway::Error> {
    use kube::CustomResourceExt;
    let mut out = String::new();
    for crd in [NodeMaintenance::crd(), MaintenanceOperatorConfig::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// The checked-in CRD YAML must be what the types generate; regenerate with
    /// `cargo run -- crdgen > crds/crds.yaml`.
    #[test]
    fn checked_in_crd_yaml_matches_the_types() {
        let generated = super::crd_yaml().expect("CRDs serialize");
        let checked_in = include_str!("../crds.yaml");
        assert!(
            generated == checked_in,
            "crds/crds.yaml is stale: run `cargo run -- crdgen > crds/crds.yaml`"
        );
    }
}
