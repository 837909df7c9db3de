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
}

fn main() -> ExitCode {
    let args = Args::parse();
    let dir = args.dir.unwrap_or_else(dev::default_dir);
    let result = match args.command {
        Action::Start => Broker::start_kept(&dir)
            .and_then(Broker::leave_running)
            .map(|broker| {
                println!("amqp:       {}", broker.amqp_url);
                println!("management: {} (guest / guest)", broker.mgmt_url);
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
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("broker: {error:#}");
            ExitCode::from(1)
        }
    }
}
