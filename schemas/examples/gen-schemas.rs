//! Writes the JSON Schema of every payload type into `schemas/json/`.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("json");
    std::fs::create_dir_all(&dir)?;
    for entry in multipilot_schemas::catalog::entries() {
        let text =
            serde_json::to_string_pretty(&entry.schema).map_err(std::io::Error::other)? + "\n";
        std::fs::write(dir.join(entry.file_name()), text)?;
    }
    Ok(())
}
