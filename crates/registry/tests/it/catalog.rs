use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use async_trait::async_trait;
use quiver_contract::{CallContext, Envelope, Lifecycle, Mode, Tool, ToolResult, ToolSpec};
use quiver_registry::{
    AdvertiseOptions, Catalog, CatalogEvent, Family, FamilyOrder, FamilyTools, RegistryError,
    order_families,
};
use serde_json::json;

use crate::support::{add, echo, tool};

fn named(name: &str) -> Arc<dyn Tool> {
    tool(
        ToolSpec::new(name, format!("The {name} tool.")),
        |_, _| async { Ok(Envelope::text("x")) },
    )
}

fn read_only(name: &str) -> Arc<dyn Tool> {
    tool(
        ToolSpec::new(name, format!("The {name} tool.")).read_only(),
        |_, _| async { Ok(Envelope::text("x")) },
    )
}

#[test]
fn register_rejects_duplicates_and_register_all_is_first_wins() {
    let catalog = Catalog::new();
    catalog.register(echo()).unwrap();
    assert_eq!(
        catalog.register(echo()),
        Err(RegistryError::Conflict {
            name: "echo".into()
        })
    );
    let first = tool(ToolSpec::new("b", "first b"), |_, _| async {
        Ok(Envelope::text("first"))
    });
    let second = tool(ToolSpec::new("b", "second b"), |_, _| async {
        Ok(Envelope::text("second"))
    });
    let report = catalog.register_all(
        "server-global MCP",
        vec![named("a"), first, second, named("echo"), named("Bad-Name")],
    );
    assert_eq!(report.registered, vec!["a", "b"]);
    let skipped: Vec<_> = report.skipped.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(skipped, vec!["b", "echo", "Bad-Name"]);
    assert_eq!(catalog.lookup("b").unwrap().spec.description, "first b");
    assert_eq!(
        report.warning_lines(),
        vec![
            "server-global MCP: skipped duplicate tool name(s) (2): b, echo".to_owned(),
            "server-global MCP: skipped invalid tool(s) (1): Bad-Name (invalid tool name \"Bad-Name\": each segment must start with a lowercase ASCII letter)".to_owned(),
        ]
    );
}

#[test]
#[allow(clippy::redundant_clone)]
fn must_register_panics_on_a_duplicate() {
    let catalog = Catalog::new();
    catalog.must_register(echo());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        catalog.must_register(echo())
    }));
    assert!(result.is_err());
}

#[test]
fn invalid_schemas_are_rejected_at_registration() {
    let catalog = Catalog::new();
    let bad = tool(
        ToolSpec::new("bad", "x")
            .with_schema(json!({"type": "object", "properties": {"a": {"type": 12}}})),
        |_, _| async { Ok(Envelope::text("x")) },
    );
    let err = catalog.register(bad).unwrap_err();
    assert!(matches!(err, RegistryError::InvalidSchema { .. }), "{err}");
}

#[test]
fn lists_are_sorted_and_respect_mode_visibility() {
    let catalog = Catalog::new();
    catalog.register(named("zeta")).unwrap();
    catalog.register(read_only("alpha")).unwrap();
    catalog
        .register(tool(
            ToolSpec::new("plan", "Plans.").plan_only(),
            |_, _| async { Ok(Envelope::text("x")) },
        ))
        .unwrap();
    catalog
        .register(tool(
            ToolSpec::new("hidden", "Internal.")
                .read_only()
                .with_category("internal"),
            |_, _| async { Ok(Envelope::text("x")) },
        ))
        .unwrap();
    catalog
        .register(tool(
            ToolSpec::new("draft", "Draft.").with_lifecycle(Lifecycle::Draft),
            |_, _| async { Ok(Envelope::text("x")) },
        ))
        .unwrap();
    catalog
        .register(tool(
            ToolSpec::new("off", "Off.").with_enabled(false),
            |_, _| async { Ok(Envelope::text("x")) },
        ))
        .unwrap();
    let names = |mode| {
        catalog
            .specs(mode)
            .into_iter()
            .map(|s| s.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        catalog.names(),
        vec!["alpha", "draft", "hidden", "off", "plan", "zeta"]
    );
    assert_eq!(names(Mode::Chat), vec!["alpha", "zeta"]);
    assert_eq!(names(Mode::Plan), vec!["alpha", "plan"]);
    assert_eq!(catalog.available(Mode::Agentic).len(), 2);
}

#[test]
fn advertised_specs_inject_reasoning_and_use_lightweight_specs() {
    let catalog = Catalog::new();
    catalog.register(add()).unwrap();
    catalog
        .register(tool(
            ToolSpec::new(
                "big",
                "Does a big thing. With many details that cost tokens.",
            )
            .progressive()
            .with_schema(json!({
                "type": "object", "properties": {"q": {"type": "string", "description": "Query."}}
            })),
            |_, _| async { Ok(Envelope::text("x")) },
        ))
        .unwrap();
    catalog
        .register(tool(
            ToolSpec::new("plan", "Plans.").plan_only().read_only(),
            |_, _| async { Ok(Envelope::text("x")) },
        ))
        .unwrap();
    let specs = catalog.advertised_specs(Mode::Chat, &AdvertiseOptions::default());
    let add = specs.iter().find(|s| s.name == "add").unwrap();
    assert_eq!(
        add.input_schema["properties"]["reasoning"]["type"],
        "string"
    );
    assert!(
        add.input_schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r != "reasoning")
    );
    let big = specs.iter().find(|s| s.name == "big").unwrap();
    assert!(
        big.description.contains("call describe_tool"),
        "{}",
        big.description
    );
    assert!(big.input_schema["properties"].get("q").is_none());
    let loaded = |n: &str| n == "big";
    let specs = catalog.advertised_specs(
        Mode::Chat,
        &AdvertiseOptions::default().with_loaded(&loaded),
    );
    let big = specs.iter().find(|s| s.name == "big").unwrap();
    assert_eq!(big.input_schema["properties"]["q"]["type"], "string");
    let plan_specs = catalog.advertised_specs(Mode::Plan, &AdvertiseOptions::default());
    let plan = plan_specs.iter().find(|s| s.name == "plan").unwrap();
    assert!(
        plan.input_schema.get("properties").is_none(),
        "plan is exempt by default"
    );
    insta::assert_json_snapshot!("advertised_add", add);
}

struct Releasing(ToolSpec, Arc<AtomicUsize>);

#[async_trait]
impl Tool for Releasing {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _: serde_json::Value, _: &CallContext) -> ToolResult {
        Ok(Envelope::text("x"))
    }
    fn release(&self) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn runtime_add_and_remove_emit_events_and_release() {
    let catalog = Arc::new(Catalog::new());
    let mut events = catalog.subscribe();
    let released = Arc::new(AtomicUsize::new(0));
    let t: Arc<dyn Tool> = Arc::new(Releasing(
        ToolSpec::new("temp", "Temporary."),
        released.clone(),
    ));
    catalog.register_in("mcp:x", t).unwrap();
    assert_eq!(
        events.recv().await.unwrap(),
        CatalogEvent::Added("temp".into())
    );
    let v = catalog.version();
    assert!(catalog.remove("temp").is_some());
    assert_eq!(
        events.recv().await.unwrap(),
        CatalogEvent::Removed("temp".into())
    );
    assert_eq!(released.load(Ordering::SeqCst), 1);
    assert!(catalog.version() > v);
    assert!(catalog.remove("temp").is_none());
    // Concurrent adds from many threads all land.
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let c = catalog.clone();
            std::thread::spawn(move || {
                for j in 0..50 {
                    c.register_in("t", named(&format!("t{i}_{j}"))).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(catalog.len(), 400);
    assert_eq!(catalog.remove_family("t").len(), 400);
    assert!(catalog.is_empty());
}

#[test]
fn ordered_assembly_checks_the_declared_order() {
    let order = ["core", "server-global MCP", "custom", "skills"];
    let fams = || {
        vec![
            FamilyTools::new("skills", vec![]),
            FamilyTools::new("core", vec![echo()]),
            FamilyTools::new("custom", vec![]),
            FamilyTools::new("server-global MCP", vec![]),
        ]
    };
    let ordered = order_families(&order, fams()).unwrap();
    assert_eq!(
        ordered.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        order
    );
    let missing = order_families(
        &order,
        fams().into_iter().filter(|f| f.name != "custom").collect(),
    )
    .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("`custom` is in the declared order but no family provides it"),
        "{missing}"
    );
    let mut extra = fams();
    extra.push(FamilyTools::new("plugins", vec![]));
    let err = order_families(&order, extra).unwrap_err();
    assert!(
        err.to_string()
            .contains("`plugins` is not in the declared order"),
        "{err}"
    );
}

/// The order the host gives: classes first to last, and between MCP servers' own families
/// (`mcp:<server>`) the one listed first, whichever registers first; a server not listed
/// comes after the listed ones, a family of no class after every class.
#[test]
fn a_family_order_ranks_classes_then_the_servers_as_listed() {
    let order = FamilyOrder::new([Family::Core, Family::ServerMcp, Family::Skills])
        .with_servers(vec!["mcp:b".into(), "mcp:a".into()]);
    let mut families = ["plugins", "skills", "mcp:z", "mcp:a", "mcp:b", "core"];
    families.sort_by_key(|f| order.rank(f));
    assert_eq!(
        families,
        ["core", "mcp:b", "mcp:a", "mcp:z", "skills", "plugins"]
    );
    assert_eq!(order.rank("mcp:x"), order.rank("mcp:y"));
    assert_eq!(Family::of("mcp:x"), Some(Family::ServerMcp));
    assert_eq!(Family::of("custom tools"), Some(Family::Custom));
    assert_eq!(Family::of("plugins"), None);
    assert_eq!(Family::mcp_server("mcp:x"), Some("x"));

    let catalog = Catalog::new();
    catalog.set_family_order(order);
    catalog.register_in("mcp:a", named("t")).unwrap();
    catalog.register_in("mcp:b", named("t")).unwrap();
    assert_eq!(&*catalog.lookup("t").unwrap().family, "mcp:b");
    assert!(catalog.register_in("mcp:a", named("u")).is_ok());
    assert!(catalog.register_in("mcp:z", named("u")).is_err());
}

/// With a family order set, a family that registers late (an MCP server connecting after
/// start-up) takes a name from a later family that registered first; the later family's
/// tool is reported shadowed and comes back when the name is let go.
#[test]
fn the_family_order_decides_a_name_whenever_each_family_registers() {
    let catalog = Catalog::new();
    catalog.set_family_order(FamilyOrder::new([
        Family::Core,
        Family::ServerMcp,
        Family::Skills,
    ]));
    let skill = tool(ToolSpec::new("skill", "from skills"), |_, _| async {
        Ok(Envelope::text("skills"))
    });
    let upstream = tool(ToolSpec::new("skill", "from an upstream"), |_, _| async {
        Ok(Envelope::text("mcp"))
    });
    catalog.register_in("skills", skill).unwrap();
    let mut events = catalog.subscribe();
    let report = catalog.register_all("mcp:x", vec![upstream]);
    assert_eq!(report.registered, ["skill"]);
    assert_eq!(&*catalog.lookup("skill").unwrap().family, "mcp:x");
    assert_eq!(
        events.try_recv().unwrap(),
        CatalogEvent::Added("skill".into())
    );
    let shadowed = catalog.shadowed();
    assert_eq!(shadowed.len(), 1);
    assert_eq!(
        (shadowed[0].family.as_str(), shadowed[0].name.as_str()),
        ("skills", "skill")
    );
    assert!(shadowed[0].is_duplicate());
    // A family later in the order cannot take it back, nor can one of the same rank.
    assert!(catalog.register_in("skills", named("skill")).is_err());
    assert!(catalog.register_in("mcp:y", named("skill")).is_err());
    // The upstream lets go: the skill is back (an `Added` for the index to re-read).
    catalog.remove_family("mcp:x");
    assert_eq!(&*catalog.lookup("skill").unwrap().family, "skills");
    assert_eq!(
        events.try_recv().unwrap(),
        CatalogEvent::Added("skill".into())
    );
    assert!(catalog.shadowed().is_empty());
    // Without an order, the first registration in time wins, as before.
    let plain = Catalog::new();
    plain.register_in("skills", named("skill")).unwrap();
    assert!(plain.register_in("mcp:x", named("skill")).is_err());
    // A shadowed tool of a family that is removed does not come back.
    catalog.register_in("mcp:z", named("skill")).unwrap();
    catalog.remove_family("skills");
    catalog.remove("skill");
    assert!(catalog.lookup("skill").is_none());
}

/// `advertised_extra_bytes` is what `advertise` adds to a definition's bytes, for every
/// schema shape (the surface budgets a round with it without advertising).
#[test]
fn advertised_extra_bytes_matches_advertise() {
    use quiver_registry::{AdvertiseOptions, advertise, advertised_extra_bytes};
    let shapes = [
        json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
        json!({"type": "object", "properties": {}}),
        json!({"type": "object"}),
        json!({}),
        json!({"type": "object", "properties": {"reasoning": {"type": "string"}}}),
        json!({"type": "object", "properties": true}),
        json!(true),
        json!({"type": "object", "properties": {"s": {"type": "string", "description": "a \"quoted\" é"}}}),
    ];
    let exempt = vec!["plan".to_owned()];
    let all = |_: &str| true;
    let none = |_: &str| false;
    for schema in shapes {
        for progressive in [false, true] {
            for (name, inject) in [("t", true), ("t", false), ("plan", true)] {
                for loaded in [false, true] {
                    let mut spec =
                        ToolSpec::new(name, "A tool. More words here.").with_schema(schema.clone());
                    if progressive {
                        spec = spec.progressive();
                    }
                    let check: &(dyn Fn(&str) -> bool + Sync) = if loaded { &all } else { &none };
                    let opts = AdvertiseOptions::default()
                        .with_reasoning(inject)
                        .with_exempt(&exempt)
                        .with_loaded(check);
                    let base = if progressive && !loaded {
                        spec.lightweight()
                    } else {
                        spec.clone()
                    };
                    let want =
                        advertise(spec.clone(), &opts).definition_bytes() - base.definition_bytes();
                    assert_eq!(
                        advertised_extra_bytes(&spec, loaded, &opts),
                        want,
                        "{schema} progressive={progressive} name={name} inject={inject} loaded={loaded}"
                    );
                }
            }
        }
    }
}

#[test]
fn output_schemas_must_describe_an_object_and_compile() {
    let catalog = Catalog::new();
    let with_output = |name: &str, out: serde_json::Value| {
        tool(
            ToolSpec::new(name, "x").with_output_schema(out),
            |_, _| async { Ok(Envelope::text("x")) },
        )
    };
    for (name, out, expect) in [
        ("stringly", json!({"type": "string"}), "not \"object\""),
        ("untyped", json!({"properties": {}}), "no top-level `type`"),
        ("listed", json!([1]), "not a JSON object but an array"),
        (
            "broken",
            json!({"type": "object", "properties": {"a": {"type": 12}}}),
            "its output schema does not compile",
        ),
    ] {
        let err = catalog.register(with_output(name, out)).unwrap_err();
        assert!(err.to_string().contains(expect), "{name}: {err}");
    }
    catalog
        .register(with_output("fine", json!({"type": "object"})))
        .unwrap();
}

/// A `$ref` to a URL is refused saying Quiver does not fetch it (jsonschema said "the
/// `resolve-http` feature or a custom resolver is required").
#[test]
fn a_schema_with_a_remote_ref_says_to_inline_it() {
    let catalog = Catalog::new();
    let spec = ToolSpec::new("remote", "x").with_schema(json!({
        "type": "object",
        "properties": {"a": {"$ref": "https://schemas.example.com/a.json"}}
    }));
    let err = catalog
        .register(tool(spec, |_, _| async { Ok(Envelope::text("x")) }))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("its input schema does not compile: it has a `$ref` to a remote schema, which Quiver does not fetch; inline the referenced schema"),
        "{err}"
    );
}
