//! Writes the JSON Schema of every payload type into `schemas/json/`, and one seed per payload type into the
//! envelope fuzz target's corpus (`fuzz/seeds/envelope/`: catalog index, header flags 0, the sample).

use std::path::Path;

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("json");
    std::fs::create_dir_all(&dir)?;
    for entry in multipilot_schemas::catalog::entries() {
        let text =
            serde_json::to_string_pretty(&entry.schema).map_err(std::io::Error::other)? + "\n";
        std::fs::write(dir.join(entry.file_name()), text)?;
    }
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/envelope");
    std::fs::create_dir_all(&seeds)?;
    for (i, entry) in multipilot_schemas::catalog::entries()
        .into_iter()
        .enumerate()
    {
        let mut seed = vec![i as u8, 0];
        seed.extend_from_slice(&entry.sample);
        std::fs::write(seeds.join(format!("seed-{}", entry.name)), seed)?;
    }
    Ok(())
}
