//! `gpuledger man`: a man page per command and subcommand (`gpuledger.1`,
//! `gpuledger-scheduler-submit.1`, ...), rendered from the command line's own definition, so
//! the pages never drift from `--help`.

use std::path::Path;

use anyhow::Context;

/// Writes the pages of `command` and every subcommand below it into `out` (created when
/// missing); how many.
pub fn write_man_pages(command: clap::Command, out: &Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut command = command;
    command.build();
    let mut written = 0;
    write_page(&command, "gpuledger", out, &mut written)?;
    Ok(written)
}

fn write_page(
    command: &clap::Command,
    name: &str,
    out: &Path,
    written: &mut usize,
) -> anyhow::Result<()> {
    let page = command
        .clone()
        .display_name(name.to_owned())
        .bin_name(name.replace('-', " "));
    let mut text = Vec::new();
    clap_mangen::Man::new(page)
        .title(name.to_owned())
        .render(&mut text)
        .with_context(|| format!("rendering the page of {name}"))?;
    let path = out.join(format!("{name}.1"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    *written += 1;
    for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
        write_page(sub, &format!("{name}-{}", sub.get_name()), out, written)?;
    }
    Ok(())
}
