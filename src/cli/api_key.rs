//! `tally api-key`: mint, list and revoke the usage API's keys in `api.keys`
//! (docs/API.md#authentication). The clear text of a key is printed once, on
//! stdout, when it is minted; the file holds only its hash.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};

use super::ConfigArg;
use crate::api::keys::{self, Keys, Scope};

#[derive(Args, Debug)]
pub struct ApiKeyArgs {
    #[command(subcommand)]
    cmd: ApiKeyCmd,
}

#[derive(Subcommand, Debug)]
enum ApiKeyCmd {
    /// Mint a key: prints it once on stdout and appends its hash to `api.keys`
    /// (created with mode 0600 if missing). A running `tally api` takes it on SIGHUP.
    Create {
        #[command(flatten)]
        config: ConfigArg,
        /// A name for the key (letters, digits, '-', '_', '.'), unique in the file.
        #[arg(long)]
        id: String,
        /// `admin` (every tenant) or `tenant:<id>[,<id>…]` (only those tenants;
        /// percent-encode a ',' or a space in an id).
        #[arg(long)]
        scope: String,
    },
    /// List the keys of `api.keys`: id and scope (no secret is stored).
    List(ConfigArg),
    /// Remove a key from `api.keys`; a running `tally api` refuses it after SIGHUP.
    Revoke {
        #[command(flatten)]
        config: ConfigArg,
        #[arg(long)]
        id: String,
    },
}

fn keys_path(c: &ConfigArg) -> anyhow::Result<PathBuf> {
    let cfg = c.load()?;
    cfg.api.keys.ok_or_else(|| {
        crate::config::ConfigError::Invalid {
            key: "api.keys".into(),
            msg: "set it to the keys file to write (e.g. /etc/tally/api-keys)".into(),
        }
        .into()
    })
}

fn read(path: &Path) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

pub(crate) fn run(a: ApiKeyArgs) -> anyhow::Result<()> {
    match a.cmd {
        ApiKeyCmd::Create { config, id, scope } => {
            let path = keys_path(&config)?;
            let scope = Scope::parse(&scope).map_err(anyhow::Error::msg)?;
            let text = read(&path)?;
            Keys::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            if text
                .lines()
                .any(|l| l.split_whitespace().next() == Some(id.as_str()))
            {
                anyhow::bail!(
                    "{}: a key {id:?} exists; revoke it first or choose another --id",
                    path.display()
                );
            }
            let (key, line) =
                keys::mint(&id, &scope, keys::random_bytes()?).map_err(anyhow::Error::msg)?;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            let sep = if text.is_empty() || text.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            writeln!(f, "{sep}{line}").with_context(|| format!("writing {}", path.display()))?;
            f.sync_all()?;
            println!("{key}");
            eprintln!(
                "tally: key {id:?} added to {} — the line above is its only copy: store it now. \
                 A running `tally api` takes it on SIGHUP.",
                path.display()
            );
            Ok(())
        }
        ApiKeyCmd::List(config) => {
            let path = keys_path(&config)?;
            let text = read(&path)?;
            Keys::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            for line in text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
            {
                let mut f = line.split_whitespace();
                println!("{}\t{}", f.next().unwrap_or(""), f.next().unwrap_or(""));
            }
            Ok(())
        }
        ApiKeyCmd::Revoke { config, id } => {
            let path = keys_path(&config)?;
            let text = read(&path)?;
            let kept: Vec<&str> = text
                .lines()
                .filter(|l| l.split_whitespace().next() != Some(id.as_str()))
                .collect();
            if kept.len() == text.lines().count() {
                anyhow::bail!("{}: no key {id:?}", path.display());
            }
            let tmp = path.with_extension("tmp");
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .with_context(|| format!("writing {}", tmp.display()))?;
            for l in kept {
                writeln!(f, "{l}")?;
            }
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
                .with_context(|| format!("replacing {}", path.display()))?;
            eprintln!(
                "tally: key {id:?} removed from {}; send SIGHUP to a running `tally api`",
                path.display()
            );
            Ok(())
        }
    }
}
