use super::*;
#[test]
fn probe_stack() {
    let n = 10240;
    let forms: Vec<(&str, String)> = vec![
        ("plus", vec!["1"; n / 2].join("+")),
        ("sel", format!("device{}", ".a".repeat((n - 6) / 2))),
        ("idx", format!("device{}", "['a']".repeat((n - 6) / 5))),
        ("meth", format!("'a'{}", ".trim()".repeat((n - 3) / 7))),
        ("and", vec!["true"; n / 8].join(" && ")),
        ("mul", vec!["1"; n / 2].join("*")),
        ("neg", format!("{}1", "-".repeat(n - 1))),
        ("not", format!("{}true", "!".repeat(n - 4))),
        ("cmp", vec!["1"; n / 3].join("==")),
        ("in", vec!["1"; n / 4].join(" in ")),
        ("tern", format!("{}true", "true?true:".repeat((n - 4) / 10))),
    ];
    let stack: usize = std::env::var("ST").unwrap().parse().unwrap();
    let env = std::sync::Arc::new(super::super::library::environment().unwrap());
    for (name, src) in forms {
        if std::env::var("FORM").map_or(false, |f| f != name) { continue; }
        let env = env.clone();
        let r = std::thread::Builder::new().stack_size(stack << 20).spawn(move || {
            match env.compile(&src) { Ok(p) => format!("ok depth {}", super::super::cost::depth(p.expression())), Err(e) => format!("err {:.80}", e.to_string()) }
        }).unwrap().join().unwrap();
        println!("{name} ({} bytes) @ {stack} MiB: {r}", src.len());
    }
}
