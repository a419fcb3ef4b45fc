//! The `wedgewatch` command line: a thin front over the library.

fn main() -> anyhow::Result<()> {
    Ok(())
}
