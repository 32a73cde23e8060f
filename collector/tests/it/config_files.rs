//! Every collector configuration shipped under `config/` loads and validates
//! (DESIGN.md §9: every file under config/ is loaded by a test).

use std::path::Path;

#[test]
fn shipped_collector_configs_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("config/ exists") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("collector") && (name.ends_with(".yaml") || name.ends_with(".yml")) {
            if let Err(e) = uctel_collector::config::load(&path) {
                panic!("{e}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 1, "no collector*.yaml under {}", dir.display());
}
