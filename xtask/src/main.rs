//! Project automation: `cargo xtask <codegen|build|demo|test|bench|setup>`.
mod codegen;
mod semantics;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "mpi-observer project tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Regenerate code from the MPI Forum's apis.json.
    Codegen {
        /// Fail if the committed output is stale instead of rewriting it.
        #[arg(long)]
        check: bool,
    },
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn main() -> Result<()> {
    let root = workspace_root();
    match Cli::parse().cmd {
        Cmd::Codegen { check } => codegen::run(&root, check),
    }
}
