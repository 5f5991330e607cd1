//! `maintenance-operator`: run the operator, dry-run the scheduler, or print the CRDs.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use maintenance_operator::{plan, run};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "maintenance-operator",
    version,
    about = "Coordinates node maintenance in Kubernetes clusters (maintenance.nvidia.com/v1alpha1)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator: admit NodeMaintenance requests, cordon, drain, uncordon.
    Run(Box<run::RunArgs>),
    /// Dry-run one scheduling round: which Pending requests would be admitted, and why not.
    Plan(plan::PlanArgs),
    /// Print the CustomResourceDefinitions as YAML (what crds/crds.yaml holds).
    Crdgen,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(*args).await,
        Command::Plan(args) => plan::run(args).await,
        Command::Crdgen => match maintenance_crds::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                Ok(())
            }
            Err(err) => Err(anyhow::anyhow!("could not render the CRDs: {err}")),
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
