//! The README's settings table names every variable the service knows, with what it does with
//! it, and `--help` lists them too.

use ratewell_rls::settings::{GO_VARIABLES, OWN_VARIABLES, Support, help};

#[test]
fn the_settings_table_lists_every_variable() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for (name, support) in GO_VARIABLES {
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("README has no row for {name}"));
        let said = match support {
            Support::Supported => "| supported |",
            Support::Ignored(_) => "| ignored, named at startup |",
            Support::Refused(_) => "| refused at startup unless off |",
        };
        assert!(row.contains(said), "{name}: {row}");
    }
    for (name, _) in OWN_VARIABLES {
        assert!(readme.contains(&format!("| `{name}` |")), "README has no row for {name}");
    }
    let help = help();
    let names = GO_VARIABLES.iter().map(|(n, _)| *n).chain(OWN_VARIABLES.iter().map(|(n, _)| *n));
    for name in names {
        assert!(help.contains(name), "--help does not name {name}");
    }
}
