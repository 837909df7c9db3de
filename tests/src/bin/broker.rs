//! `scripts/broker start|stop|url`: a throwaway RabbitMQ left running for
//! trying plugins and configs by hand, the same node the tests start (see
//! `acemq_tests::broker::dev`).

use std::path::PathBuf;
use std::process::ExitCode;

use acemq_tests::Broker;
use acemq_tests::broker::dev;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "scripts/broker",
    about = "A throwaway RabbitMQ on free loopback ports, left running until stopped",
    after_help = "\
Example:
  scripts/broker start
  ACEMQ_URL=$(scripts/broker url) acemq-host run --config host.toml
  scripts/broker stop

Exit codes: 0 done, 1 failed (or, for url, no broker runs), 2 bad usage."
)]
struct Args {
    /// The broker's folder (config, data, logs, state); the default is one
    /// per user in the temporary folder.
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Start a broker and print its URLs; it runs until `stop`.
    Start,
    /// Stop the broker and remove its folder.
    Stop,
    /// Print the AMQP URL of the running broker (for ACEMQ_URL).
    Url {
        /// The management API's URL instead (user and password: guest).
        #[arg(long)]
        mgmt: bool,
    },
    /// A cluster of nodes instead (`scripts/cluster`): its own folder, one
    /// subfolder per node.
    #[command(subcommand)]
    Cluster(ClusterAction),
}

#[derive(Debug, Subcommand)]
enum ClusterAction {
    /// Start the nodes, join them into one cluster and print their URLs.
    Start {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
    },
    /// Stop every node and remove the cluster's folder.
    Stop,
    /// Print the nodes' AMQP URLs, comma-separated (for ACEMQ_URL).
    Urls,
}

/// `scripts/cluster start|stop|urls`; `dir` defaults to one per user.
fn cluster(dir: Option<PathBuf>, action: ClusterAction) -> anyhow::Result<bool> {
    let dir = dir.unwrap_or_else(dev::default_cluster_dir);
    match action {
        ClusterAction::Start { nodes } => {
            anyhow::ensure!(nodes >= 1, "--nodes must be at least 1");
            let started = dev::start_cluster(&dir, nodes)?;
            for (index, node) in started.iter().enumerate() {
                println!(
                    "node {index}: {}  management {} (guest / guest)",
                    node.amqp_url, node.mgmt_url
                );
            }
            println!("folder: {}", dir.display());
            eprintln!("cluster: running until `scripts/cluster stop`");
            Ok(true)
        }
        ClusterAction::Stop => {
            let stopped = dev::stop_cluster(&dir)?;
            match stopped {
                true => eprintln!("cluster: stopped; {} removed", dir.display()),
                false => eprintln!("cluster: none was running in {}", dir.display()),
            }
            Ok(true)
        }
        ClusterAction::Urls => {
            let nodes = dev::running_cluster(&dir)?;
            if nodes.is_empty() {
                eprintln!(
                    "cluster: none is running in {} (scripts/cluster start starts one)",
                    dir.display()
                );
                return Ok(false);
            }
            let urls: Vec<&str> = nodes.iter().map(|n| n.amqp_url.as_str()).collect();
            println!("{}", urls.join(","));
            Ok(true)
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Action::Cluster(action) = args.command {
        return exit("cluster", cluster(args.dir, action));
    }
    let dir = args.dir.unwrap_or_else(dev::default_dir);
    let result = match args.command {
        Action::Start => Broker::start_kept(&dir)
            .and_then(Broker::leave_running)
            .map(|broker| {
                println!("amqp:       {}", broker.amqp_url);
                println!("management: {} (guest / guest)", broker.mgmt_url);
                println!("stream:     127.0.0.1:{}", broker.stream_port());
                println!("folder:     {}", broker.dir.display());
                eprintln!("broker: running until `scripts/broker stop`");
                true
            }),
        Action::Stop => dev::stop(&dir).map(|stopped| {
            match stopped {
                true => eprintln!("broker: stopped; {} removed", dir.display()),
                false => eprintln!("broker: none was running in {}", dir.display()),
            }
            true
        }),
        Action::Url { mgmt } => dev::running(&dir).map(|running| match running {
            Some(broker) => {
                println!(
                    "{}",
                    if mgmt {
                        broker.mgmt_url
                    } else {
                        broker.amqp_url
                    }
                );
                true
            }
            None => {
                eprintln!(
                    "broker: none is running in {} (scripts/broker start starts one)",
                    dir.display()
                );
                false
            }
        }),
        Action::Cluster(_) => unreachable!("handled above"),
    };
    exit("broker", result)
}

/// The exit code of `result`; an error is printed after `program: `.
fn exit(program: &str, result: anyhow::Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("{program}: {error:#}");
            ExitCode::from(1)
        }
    }
}
