//! The `report` command: read, analyse, render, write.

use std::{fs, io::Write as _, time::Duration};

use super::{Data, Limits, ReportError, analyse, html, json, select, text};
use crate::{
    cli::{ReportArgs, ReportFormat},
    client::http_get::{self, Client, Url},
};

/// Runs `mpi-observer report`.
pub fn run(args: &ReportArgs) -> Result<(), ReportError> {
    if args.files.is_empty() && args.url.is_empty() {
        return Err(ReportError::Empty(
            "nothing to report on: give a snapshot file (written by `attach --report-file`) or --url http://HOST:PORT of a running daemon".into(),
        ));
    }
    let mut data = Vec::new();
    for path in &args.files {
        data.push(Data::read(path)?);
    }
    let urls = args
        .url
        .iter()
        .map(|u| Url::parse(u).map(|u| u.with_path("/report.json")))
        .collect::<Result<Vec<_>, _>>()?;
    // The files are read once, and only when a URL needs them.
    let client = if urls.is_empty() {
        Client::default()
    } else {
        Client::new(args.ca_file.as_deref(), args.auth_file.as_deref())?
    };
    for u in &urls {
        if u.has_password() {
            log::warn!("{}", http_get::password_warning(u));
        }
        let body = client.get(u, Duration::from_secs(args.timeout))?;
        // Named without the password.
        data.push(Data::parse(&body, &u.shown())?);
    }
    let limits = Limits {
        top: args.top,
        ..Limits::default()
    };
    let reports = select(analyse(&data, limits), args.job.as_deref(), args.uid)?;
    if reports.is_empty() {
        return Err(ReportError::Empty(
            "the data holds no rank: the daemon observed none yet (or its --retain-exited let them go); \
             report again once it has attached to a job"
                .into(),
        ));
    }
    let out = match args.format {
        ReportFormat::Text => text::render(&reports),
        ReportFormat::Json => json(&reports),
        ReportFormat::Html => html::render(&reports),
    };
    match &args.output {
        Some(path) => fs::write(path, out).map_err(|source| ReportError::Write {
            path: path.display().to_string(),
            source,
        }),
        None => {
            let mut o = std::io::stdout().lock();
            match o.write_all(out.as_bytes()).and_then(|()| o.flush()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(ReportError::Write {
                    path: "stdout".into(),
                    source: e,
                }),
                _ => Ok(()),
            }
        }
    }
}
