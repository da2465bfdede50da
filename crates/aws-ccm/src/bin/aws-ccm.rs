//! `aws-ccm`: the operator tool. Subcommands take the CCM's own flags
//! (`--cloud-config`, `--kubeconfig`, `--cluster-cidr`, ...) with their
//! meaning; see docs/aws-ccm-tool.md.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::io::{BufRead, Write};
use std::process::ExitCode;

use aws_ccm::ops::orphans::{self, Outcome};
use aws_ccm::ops::{Context, Format, short_age};
use aws_ccm::options::Options;
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "aws-ccm",
    version,
    about = "Operator tool of the AWS cloud-controller-manager: why a cluster is not working (doctor), what it left behind (orphans), what it would change (plan)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Checks what the CCM depends on (AWS and the cluster); changes nothing.
    /// Exits non-zero when any check fails.
    Doctor(DoctorArgs),
    /// AWS resources with this cluster's tag that belong to no live Service or Node.
    Orphans(OrphansArgs),
    /// What the controllers would change in AWS now (like `terraform plan`).
    Plan(PlanArgs),
}

#[derive(Debug, Args)]
struct DoctorArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: Format,
    /// The CCM's IAM role, whose ELB writes IAM's policy simulator checks
    /// (default: the eks.amazonaws.com/role-arn annotation of ServiceAccount
    /// kube-system/cloud-controller-manager, else the caller's own identity).
    /// Whoever runs doctor needs iam:SimulatePrincipalPolicy on it.
    #[arg(long = "role-arn", value_name = "ARN")]
    role_arn: Option<String>,
    #[command(flatten)]
    ccm: Options,
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// Services to plan (`name` or `namespace/name`); every LoadBalancer
    /// Service, and routes, when none is named.
    services: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: Format,
    #[command(flatten)]
    ccm: Options,
}

#[derive(Debug, Args)]
struct OrphansArgs {
    /// Delete the orphans (asks first unless --yes); what is left alone is never deleted.
    #[arg(long)]
    delete: bool,
    /// With --delete: do not ask.
    #[arg(long, requires = "delete")]
    yes: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: Format,
    #[command(flatten)]
    ccm: Options,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("starting the async runtime: {e}"));
    let result = runtime.and_then(|runtime| {
        runtime.block_on(async {
            match cli.command {
                Command::Doctor(args) => run_doctor(args).await,
                Command::Orphans(args) => run_orphans(args).await,
                Command::Plan(args) => run_plan(args).await,
            }
        })
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The CCM's options, validated as the CCM validates them
/// (`--cloud-provider` may be left out: it can only be `aws`).
fn ccm_options(mut options: Options) -> anyhow::Result<aws_ccm::options::Validated> {
    if options.cloud_provider.is_empty() {
        options.cloud_provider = "aws".into();
    }
    let validated = options.validate(Vec::new())?;
    aws_ccm::logging::init(validated.options.verbosity, validated.options.log_format);
    Ok(validated)
}

async fn run_orphans(args: OrphansArgs) -> anyhow::Result<ExitCode> {
    let ctx = Context::connect(ccm_options(args.ccm)?).await?;
    let scope = orphans::Scope {
        cluster_id: ctx.cluster_id.clone(),
        routes: ctx.route_scope(),
    };
    let live = orphans::Live::read(&ctx.kube).await?;
    let audit = orphans::find(&ctx.aws, &live, &scope).await?;
    let now = chrono::Utc::now();
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&audit)?),
        Format::Text => print_audit(&audit, &scope, now),
    }
    let found = &audit.orphans;
    if !args.delete || found.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    if !args.yes && !confirm(found.len())? {
        eprintln!("nothing deleted");
        return Ok(ExitCode::FAILURE);
    }
    let failed = orphans::delete(&ctx.aws, found, |o, outcome| match outcome {
        Outcome::Deleted => eprintln!("deleted {} {}", o.kind.as_str(), o.id),
        Outcome::Failed(e) => eprintln!("FAILED to delete {} {}: {e}", o.kind.as_str(), o.id),
    })
    .await;
    Ok(ExitCode::from(u8::from(failed > 0)))
}

fn print_audit(audit: &orphans::Audit, scope: &orphans::Scope, now: chrono::DateTime<chrono::Utc>) {
    if scope.routes.is_none() {
        println!(
            "# routes not audited: the route controller would not run (pass --cluster-cidr, and --configure-cloud-routes is on)"
        );
    }
    if audit.orphans.is_empty() {
        println!("no orphans");
    }
    for o in &audit.orphans {
        let age = o.age(now).map_or("-".to_string(), short_age);
        println!("{} {} (age {age}): {}", o.kind.as_str(), o.id, o.recognised);
    }
    if !audit.kept.is_empty() {
        println!();
        println!("# {KEPT}");
        for k in &audit.kept {
            println!(
                "{} {} ({}): protected, kept from Service {}",
                k.kind.as_str(),
                k.id,
                k.name,
                k.kept_from
            );
        }
    }
    if audit.left_alone.is_empty() {
        return;
    }
    println!();
    println!("# {LEFT_ALONE}");
    for l in &audit.left_alone {
        println!("{} {} ({}): {}", l.kind.as_str(), l.id, l.name, l.why);
    }
}

/// The heading of the load balancers kept for protected Services.
const KEPT: &str =
    "protected, kept: load balancers kept when their protected Service went; never deleted";

/// The heading of what carries the cluster tag but is not the CCM's.
const LEFT_ALONE: &str = "tagged for this cluster, not made by the CCM: left alone";

/// Asks on stdin; `true` on `y` or `yes`.
fn confirm(count: usize) -> anyhow::Result<bool> {
    eprint!("delete the {count} orphan(s) listed above? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

async fn run_plan(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let ctx = Context::connect(ccm_options(args.ccm)?).await?;
    let sections = aws_ccm::ops::plan::plan(&ctx, &args.services).await?;
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&sections)?),
        Format::Text => print!("{}", aws_ccm::ops::plan::render(&sections)),
    }
    // A sync the plan shows failing (an invalid Service, an error met while
    // planning) fails the command, so that a pipeline stops before it.
    Ok(ExitCode::from(u8::from(
        sections.iter().any(|s| s.would_fail),
    )))
}

async fn run_doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    use aws_ccm::ops::doctor;
    let report = match Context::connect(ccm_options(args.ccm)?).await {
        Ok(ctx) => doctor::run(&ctx, args.role_arn.as_deref()).await,
        Err(e) => doctor::unreachable(&e),
    };
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Text => print!("{}", doctor::render(&report)),
    }
    Ok(ExitCode::from(u8::from(report.failed())))
}
