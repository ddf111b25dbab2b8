//! Making and removing databases on a server, for provisioning scripts,
//! benchmarks and tests that want a store of their own: a store lives in
//! one database, and these are the two statements around it.

use std::str::FromStr;

use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

use crate::config::PostgresConfig;
use crate::error::OpenError;

/// Whether `name` is a plain database name: lowercase ASCII letters,
/// digits and `_`, starting with a letter or `_`, at most 63 bytes (so it
/// needs no quoting and is never folded).
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

/// Runs one statement on the server of `server_url` (any database of it
/// the user may connect to), on a thread and runtime of its own.
fn run(server_url: &str, statement: String) -> Result<(), OpenError> {
    let target = PostgresConfig::new(server_url).validate()?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|error| OpenError::Thread(error.to_string()))?;
                runtime.block_on(async {
                    let failed =
                        |error| OpenError::from_postgres(&target.shown, target.database(), error);
                    let (client, connection) =
                        target.named("admin").connect(NoTls).await.map_err(failed)?;
                    let driver = tokio::spawn(connection);
                    let done = client.batch_execute(&statement).await.map_err(failed);
                    drop(client);
                    let _ = driver.await;
                    done
                })
            })
            .join()
            .unwrap_or_else(|_| Err(OpenError::Thread("the admin thread panicked".to_owned())))
    })
}

fn check_name(name: &str) -> Result<(), OpenError> {
    if plain(name) {
        Ok(())
    } else {
        Err(OpenError::Config {
            field: "database name",
            reason: format!(
                "{name:?} must be 1 to 63 lowercase letters, digits or underscores, not starting with a digit"
            ),
        })
    }
}

/// Creates the empty database `name` on the server of `server_url` and
/// returns connection settings for it (the server's, with the database
/// replaced), ready for [`PostgresConfig::new`]. Blocks until done.
pub fn create_database(server_url: &str, name: &str) -> Result<String, OpenError> {
    check_name(name)?;
    run(server_url, format!("CREATE DATABASE {name}"))?;
    database_url(server_url, name)
}

/// Drops the database `name` on the server of `server_url`, closing the
/// connections still open to it; nothing happens if it does not exist.
/// Blocks until done.
pub fn drop_database(server_url: &str, name: &str) -> Result<(), OpenError> {
    check_name(name)?;
    run(
        server_url,
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
}

/// The settings of `server_url` with the database `name`, in libpq's
/// `key=value` form.
pub fn database_url(server_url: &str, name: &str) -> Result<String, OpenError> {
    let settings =
        tokio_postgres::Config::from_str(server_url).map_err(|error| OpenError::Url {
            message: error.to_string(),
        })?;
    let quote = |value: &str| format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut parts = Vec::new();
    if let Some(host) = settings.get_hosts().first() {
        let host = match host {
            Host::Tcp(host) => host.clone(),
            Host::Unix(path) => path.display().to_string(),
        };
        parts.push(format!("host={}", quote(&host)));
    }
    if let Some(port) = settings.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = settings.get_user() {
        parts.push(format!("user={}", quote(user)));
    }
    if let Some(password) = settings.get_password() {
        parts.push(format!(
            "password={}",
            quote(&String::from_utf8_lossy(password))
        ));
    }
    parts.push(format!("dbname={}", quote(name)));
    Ok(parts.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_are_taken_and_settings_keep_the_server() {
        for name in ["baton", "bench_1", "_x"] {
            assert!(plain(name), "{name}");
        }
        for name in ["", "1st", "Upper", "semi;colon", "a b", &"x".repeat(64)] {
            assert!(!plain(name), "{name}");
        }
        let url = database_url("postgres://alice:s'cret@db.example:6543/postgres", "work")
            .expect("valid");
        assert_eq!(
            url,
            "host='db.example' port=6543 user='alice' password='s\\'cret' dbname='work'"
        );
        let settings = tokio_postgres::Config::from_str(&url).expect("reads back");
        assert_eq!(settings.get_password(), Some(&b"s'cret"[..]));
        assert_eq!(settings.get_dbname(), Some("work"));
    }
}
