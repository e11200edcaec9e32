//! `eddy-operator crd` prints the StatefulStreamApp CRD.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "eddy-operator",
    version,
    about = "Runs eddy apps on Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the StatefulStreamApp CustomResourceDefinition (YAML).
    Crd,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => {
            print!("{}", serde_yaml::to_string(&eddy_crds::resource::crd())?);
            Ok(())
        }
    }
}
