//! The health report as text for people. Every string that came from a
//! slice is shown with control and bidirectional-formatting characters
//! escaped, so a hostile slice cannot move the cursor or reorder what the
//! terminal shows. The JSON form is the report itself (serde).

use std::fmt::Write as _;

use super::{DeviceReport, GpuReport, GpuState, NodeReport, Report, TaintReport, plural};

/// `s` with control and bidi characters escaped (`\u{1b}`).
pub fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
        {
            let _ = write!(out, "{}", c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// The whole report.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    for node in &report.nodes {
        render_node(&mut out, node);
    }
    let s = &report.summary;
    let _ = writeln!(
        out,
        "{}, {}, {}: {} tainted, {} unschedulable",
        plural(s.nodes, "node", "nodes"),
        plural(s.gpus, "GPU", "GPUs"),
        plural(s.devices, "device", "devices"),
        s.tainted_devices,
        s.unschedulable_devices
    );
    out
}

fn render_node(out: &mut String, node: &NodeReport) {
    let tainted = node
        .gpus
        .iter()
        .filter(|g| g.state != GpuState::NoTaints)
        .count();
    let pools: Vec<String> = node
        .pools
        .iter()
        .map(|p| format!("{} generation {}", clean(&p.name), p.generation))
        .collect();
    let _ = writeln!(
        out,
        "node {} (pool {}): {} of {} with taints",
        clean(&node.node),
        pools.join(", "),
        tainted,
        plural(node.gpus.len(), "GPU", "GPUs"),
    );
    for gpu in &node.gpus {
        render_gpu(out, gpu);
    }
}

/// One GPU: its line and, when it has taints, its taints (as in [`text`]).
pub fn gpu_text(gpu: &GpuReport) -> String {
    let mut out = String::new();
    render_gpu(&mut out, gpu);
    out
}

fn render_gpu(out: &mut String, gpu: &GpuReport) {
    let mut head = match gpu.minor {
        Some(m) => format!("  gpu {m}"),
        None if gpu.uuid.is_some() => "  gpu".to_owned(),
        None => "  devices of no known GPU".to_owned(),
    };
    for part in [&gpu.uuid, &gpu.product_name].into_iter().flatten() {
        let _ = write!(head, " {}", clean(part));
    }
    let blocked = gpu.devices.iter().filter(|d| !d.schedulable).count();
    let detail = match gpu.state {
        GpuState::PartlyUnschedulable | GpuState::Unschedulable | GpuState::NoExecute
            if gpu.devices.len() > 1 =>
        {
            format!(" ({blocked} of {} devices)", gpu.devices.len())
        }
        _ => String::new(),
    };
    let _ = writeln!(out, "{head}: {}{detail}", gpu.state.text());
    if gpu.state == GpuState::NoTaints {
        return;
    }
    // A whole-GPU fault taints every device alike: say it once.
    let first = &gpu.devices[0];
    if gpu.devices.len() > 1
        && gpu
            .devices
            .iter()
            .all(|d| d.taints == first.taints && d.omitted_taints == first.omitted_taints)
    {
        let _ = writeln!(out, "    all {} devices:", gpu.devices.len());
        render_taints(out, first);
        return;
    }
    for device in gpu.devices.iter().filter(|d| !d.taints.is_empty()) {
        let _ = writeln!(out, "    {}:", clean(&device.name));
        render_taints(out, device);
    }
}

fn render_taints(out: &mut String, device: &DeviceReport) {
    for taint in &device.taints {
        render_taint(out, taint);
    }
    if device.omitted_taints > 0 {
        let _ = writeln!(out, "      ... and {} more", device.omitted_taints);
    }
}

fn render_taint(out: &mut String, taint: &TaintReport) {
    let mut line = format!("      {}", clean(&taint.key));
    if let Some(v) = &taint.value {
        let _ = write!(line, "={}", clean(v));
    }
    let _ = write!(line, " {}", clean(&taint.effect));
    if let Some(t) = &taint.time_added {
        let _ = write!(line, " since {}", clean(t));
    }
    let _ = writeln!(out, "{line}");
    let _ = writeln!(out, "        {}", clean(&taint.meaning));
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn control_and_bidi_characters_are_escaped() {
        assert_eq!(clean("gpu-0"), "gpu-0");
        assert_eq!(clean("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(clean("x\ny\r"), "x\\u{a}y\\u{d}");
        assert_eq!(clean("evil\u{202e}txt"), "evil\\u{202e}txt");
        assert_eq!(clean("ünïcode ok"), "ünïcode ok");
    }
}
