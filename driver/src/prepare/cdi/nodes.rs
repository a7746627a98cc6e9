//! Device nodes for CDI specs: the GPU node `/dev/nvidia<minor>`, the control
//! nodes, and for MIG devices the `/dev/nvidia-caps/nvidia-cap<N>` nodes of
//! the GPU and compute instance, whose minors `N` are read from
//! `<proc-root>/driver/nvidia/capabilities/gpu<m>/mig/gi<g>[/ci<c>]/access`.
//!
//! Nodes are looked up under the dev root (so tests and the demo can use
//! stand-in files) and named in the spec by their host path, without
//! type/major/minor: the runtime stats the host path. `/dev/nvidiactl` and
//! the GPU's node are required; `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools`
//! exist only once the `nvidia-uvm` module is loaded and are left out (with a
//! warning) when missing, as NVIDIA's tooling does. A capability node is
//! made by `nvidia-modprobe`, not by the kernel module, so a new MIG
//! device's may not exist on the host: then the spec gives its type and
//! numbers (the `nvidia-caps` major from `<proc-root>/devices`, the minor
//! and mode from the capability file) and the runtime makes the node in the
//! container.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::prepare::capped::{Capped, read_capped};

use super::spec::DeviceNode;
use super::{CdiError, HostRoot};

/// Largest capability file read (they are a few dozen bytes).
const MAX_CAP_FILE: u64 = 4096;
/// Largest `<proc-root>/devices` read (a few hundred bytes).
const MAX_DEVICES_FILE: u64 = 64 * 1024;

/// Control nodes: `(container path, required)`.
pub const CONTROL_NODES: &[(&str, bool)] = &[
    ("/dev/nvidiactl", true),
    ("/dev/nvidia-uvm", false),
    ("/dev/nvidia-uvm-tools", false),
];

/// The node-wide control nodes found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlNodes {
    /// The nodes, in [`CONTROL_NODES`] order.
    pub nodes: Vec<DeviceNode>,
}

/// The nodes of a whole GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuNodes {
    /// The GPU's minor number.
    pub minor: u32,
    /// `/dev/nvidia<minor>`.
    pub nodes: Vec<DeviceNode>,
}

/// The nodes of a MIG device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigNodes {
    /// The parent GPU's minor number.
    pub parent_minor: u32,
    /// The capability minor of the GPU instance.
    pub gi_cap_minor: u32,
    /// The capability minor of the compute instance.
    pub ci_cap_minor: u32,
    /// The parent's `/dev/nvidia<minor>` and both capability nodes.
    pub nodes: Vec<DeviceNode>,
}

/// Finds device nodes under a dev root and capability minors under a proc root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLocator {
    dev_root: HostRoot,
    proc_root: PathBuf,
}

impl NodeLocator {
    /// Nodes under `dev_root` (`/` in production), capabilities under
    /// `proc_root` (`/proc` in production).
    pub fn new(dev_root: HostRoot, proc_root: impl Into<PathBuf>) -> Self {
        Self {
            dev_root,
            proc_root: proc_root.into(),
        }
    }

    /// The node at container path `path` (absolute), if it exists.
    pub(crate) fn node(&self, path: &str) -> Result<Option<DeviceNode>, CdiError> {
        let rel = Path::new(path.trim_start_matches('/'));
        let local = self.dev_root.local(rel);
        match std::fs::metadata(&local) {
            Ok(_) => Ok(Some(DeviceNode {
                path: path.to_owned(),
                host_path: Some(self.dev_root.host_path(rel)),
                ..DeviceNode::default()
            })),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CdiError::io("stat", &local, e)),
        }
    }

    /// The node at container path `path` (absolute); an error naming it
    /// when it is missing.
    pub(crate) fn required(&self, path: &str) -> Result<DeviceNode, CdiError> {
        self.node(path)?.ok_or_else(|| self.missing(path))
    }

    /// The error for node `path` missing under the dev root.
    fn missing(&self, path: &str) -> CdiError {
        CdiError::DeviceNodeMissing {
            path: self.dev_root.local(Path::new(path.trim_start_matches('/'))),
        }
    }

    /// The control nodes; errors when a required one is missing.
    pub fn control(&self) -> Result<ControlNodes, CdiError> {
        let mut nodes = Vec::new();
        for (path, required) in CONTROL_NODES {
            if *required {
                nodes.push(self.required(path)?);
            } else if let Some(node) = self.node(path)? {
                nodes.push(node);
            } else {
                tracing::warn!(node = path, "optional NVIDIA device node missing; left out");
            }
        }
        Ok(ControlNodes { nodes })
    }

    /// The nodes of the whole GPU with this minor.
    pub fn gpu(&self, minor: u32) -> Result<GpuNodes, CdiError> {
        Ok(GpuNodes {
            minor,
            nodes: vec![self.required(&format!("/dev/nvidia{minor}"))?],
        })
    }

    /// The nodes of MIG device `gi`/`ci` on the GPU with minor `parent_minor`.
    pub fn mig(&self, parent_minor: u32, gi: u32, ci: u32) -> Result<MigNodes, CdiError> {
        let gi_dir = self.proc_root.join(format!(
            "driver/nvidia/capabilities/gpu{parent_minor}/mig/gi{gi}"
        ));
        let gi_cap = read_cap(&gi_dir.join("access"))?;
        let ci_cap = read_cap(&gi_dir.join(format!("ci{ci}/access")))?;
        let mut nodes = vec![self.required(&format!("/dev/nvidia{parent_minor}"))?];
        nodes.extend(self.cap_nodes(&[gi_cap, ci_cap])?);
        Ok(MigNodes {
            parent_minor,
            gi_cap_minor: gi_cap.minor,
            ci_cap_minor: ci_cap.minor,
            nodes,
        })
    }

    /// The nodes of capabilities `caps`: the host's, or else ones the
    /// runtime makes from their numbers (`<proc-root>/devices` is read at
    /// most once, and only when a node is missing).
    fn cap_nodes(&self, caps: &[Cap]) -> Result<Vec<DeviceNode>, CdiError> {
        let mut major: Option<Option<u32>> = None;
        let mut nodes = Vec::with_capacity(caps.len());
        for cap in caps {
            let path = format!("/dev/nvidia-caps/nvidia-cap{}", cap.minor);
            if let Some(node) = self.node(&path)? {
                nodes.push(node);
                continue;
            }
            let found = match major {
                Some(found) => found,
                None => *major.insert(self.caps_major()?),
            };
            let Some(major) = found else {
                return Err(self.missing(&path));
            };
            nodes.push(DeviceNode {
                path,
                node_type: Some("c".into()),
                major: Some(major.into()),
                minor: Some(cap.minor.into()),
                file_mode: cap.mode,
                ..DeviceNode::default()
            });
        }
        Ok(nodes)
    }

    /// The major number of `nvidia-caps` in `<proc-root>/devices`, if the
    /// module registered it.
    fn caps_major(&self) -> Result<Option<u32>, CdiError> {
        let path = self.proc_root.join("devices");
        let text =
            read_small(&path, MAX_DEVICES_FILE).map_err(|reason| CdiError::BadCapability {
                path: path.clone(),
                reason,
            })?;
        Ok(text.and_then(|t| parse_char_major(&t, "nvidia-caps")))
    }
}

/// The major of character device `name` in the text of `/proc/devices`
/// (a `Character devices:` section of `<major> <name>` lines, then
/// `Block devices:`).
pub fn parse_char_major(text: &str, name: &str) -> Option<u32> {
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((major, n)) = line.split_once(char::is_whitespace)
            && n.trim() == name
        {
            return major.parse().ok();
        }
    }
    None
}

/// What a capability `access` file says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// `DeviceFileMinor`.
    pub minor: u32,
    /// `DeviceFileMode` (permission bits, written in decimal), if given.
    pub mode: Option<u32>,
}

/// Reads a capability `access` file.
pub fn read_cap(path: &Path) -> Result<Cap, CdiError> {
    let bad = |reason: String| CdiError::BadCapability {
        path: path.to_path_buf(),
        reason,
    };
    let text = read_small(path, MAX_CAP_FILE)
        .map_err(&bad)?
        .ok_or_else(|| bad("not found (does the MIG instance exist?)".into()))?;
    let minor = parse_cap_minor(&text).map_err(&bad)?;
    let mode = parse_cap_mode(&text).map_err(bad)?;
    Ok(Cap { minor, mode })
}

/// Reads the small text file `path`, at most `max` bytes (`None` when it
/// does not exist); the error says what went wrong.
fn read_small(path: &Path, max: u64) -> Result<Option<String>, String> {
    match read_capped(path, max).map_err(|e| e.to_string())? {
        Capped::Missing => Ok(None),
        Capped::TooLarge(_) => Err(format!("larger than {max} bytes")),
        Capped::Bytes(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| "not UTF-8 text".to_owned()),
    }
}

/// The trimmed value of the one `key: value` line of a capability file,
/// if there is one.
fn cap_field<'a>(text: &'a str, key: &str) -> Result<Option<&'a str>, String> {
    let mut found = None;
    for line in text.lines() {
        let Some((k, value)) = line.split_once(':') else {
            continue;
        };
        if k.trim() != key {
            continue;
        }
        if found.is_some() {
            return Err(format!("more than one {key} line"));
        }
        found = Some(value.trim());
    }
    Ok(found)
}

/// Parses the optional `DeviceFileMode: N` line (decimal permission bits).
pub fn parse_cap_mode(text: &str) -> Result<Option<u32>, String> {
    cap_field(text, "DeviceFileMode")?
        .map(|value| {
            value
                .parse::<u32>()
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| format!("DeviceFileMode {value:?} is not a file mode"))
        })
        .transpose()
}

/// Parses the `DeviceFileMinor: N` line of a capability file.
pub fn parse_cap_minor(text: &str) -> Result<u32, String> {
    let value = cap_field(text, "DeviceFileMinor")?.ok_or("no DeviceFileMinor line")?;
    value
        .parse::<u32>()
        .map_err(|_| format!("DeviceFileMinor {value:?} is not a number"))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    struct Fake {
        _tmp: tempfile::TempDir,
        dev: PathBuf,
        proc: PathBuf,
    }

    fn fake(nodes: &[&str]) -> Fake {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("devroot");
        let proc = tmp.path().join("proc");
        fs::create_dir_all(dev.join("dev/nvidia-caps")).unwrap();
        for n in nodes {
            fs::write(dev.join(n.trim_start_matches('/')), b"").unwrap();
        }
        Fake {
            _tmp: tmp,
            dev,
            proc,
        }
    }

    fn cap(f: &Fake, rel: &str, text: &str) {
        let p = f.proc.join("driver/nvidia/capabilities").join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    #[test]
    fn control_nodes_required_and_optional() {
        let f = fake(&["/dev/nvidiactl", "/dev/nvidia-uvm"]);
        let loc = NodeLocator::new(HostRoot::new(&f.dev, "/"), &f.proc);
        let c = loc.control().unwrap();
        let paths: Vec<(&str, Option<&str>)> = c
            .nodes
            .iter()
            .map(|n| (n.path.as_str(), n.host_path.as_deref()))
            .collect();
        assert_eq!(
            paths,
            [
                ("/dev/nvidiactl", Some("/dev/nvidiactl")),
                ("/dev/nvidia-uvm", Some("/dev/nvidia-uvm"))
            ]
        );

        let f = fake(&["/dev/nvidia-uvm"]);
        let loc = NodeLocator::new(HostRoot::same(&f.dev), &f.proc);
        let err = loc.control().unwrap_err();
        assert!(
            err.to_string().ends_with("devroot/dev/nvidiactl not found"),
            "{err}"
        );
    }

    #[test]
    fn gpu_node_host_path_is_rewritten_from_the_dev_root() {
        let f = fake(&["/dev/nvidia3"]);
        let loc = NodeLocator::new(HostRoot::same(&f.dev), &f.proc);
        let g = loc.gpu(3).unwrap();
        assert_eq!(g.nodes[0].path, "/dev/nvidia3");
        assert_eq!(
            g.nodes[0].host_path.as_deref(),
            Some(f.dev.join("dev/nvidia3").to_str().unwrap())
        );
        assert!(matches!(
            loc.gpu(4).unwrap_err(),
            CdiError::DeviceNodeMissing { .. }
        ));
    }

    #[test]
    fn mig_nodes_come_from_the_capability_files() {
        let f = fake(&[
            "/dev/nvidia1",
            "/dev/nvidia-caps/nvidia-cap21",
            "/dev/nvidia-caps/nvidia-cap22",
        ]);
        cap(
            &f,
            "gpu1/mig/gi2/access",
            "DeviceFileMinor: 21\nDeviceFileMode: 292\n",
        );
        cap(
            &f,
            "gpu1/mig/gi2/ci0/access",
            "DeviceFileMinor: 22\nDeviceFileMode: 292\n",
        );
        let loc = NodeLocator::new(HostRoot::new(&f.dev, "/"), &f.proc);
        let m = loc.mig(1, 2, 0).unwrap();
        assert_eq!((m.gi_cap_minor, m.ci_cap_minor), (21, 22));
        let paths: Vec<&str> = m.nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap21",
                "/dev/nvidia-caps/nvidia-cap22"
            ]
        );
        assert_eq!(
            m.nodes[2].host_path.as_deref(),
            Some("/dev/nvidia-caps/nvidia-cap22")
        );

        // The compute instance's file is missing.
        let err = loc.mig(1, 2, 1).unwrap_err().to_string();
        assert!(err.contains("gpu1/mig/gi2/ci1/access"), "{err}");
        assert!(err.contains("not found"), "{err}");
        // The capability node itself is missing, and the module's major
        // is not known either.
        cap(&f, "gpu1/mig/gi2/ci1/access", "DeviceFileMinor: 23\n");
        let err = loc.mig(1, 2, 1).unwrap_err().to_string();
        assert!(err.contains("nvidia-cap23 not found"), "{err}");
        // With the major in /proc/devices, the runtime makes the node from
        // its numbers; the mode comes from the capability file.
        fs::write(
            f.proc.join("devices"),
            "Character devices:\n  1 mem\n195 nvidia\n237 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n238 nvidia-caps-fake\n",
        )
        .unwrap();
        cap(
            &f,
            "gpu1/mig/gi2/ci1/access",
            "DeviceFileMinor: 23\nDeviceFileMode: 292\n",
        );
        let m = loc.mig(1, 2, 1).unwrap();
        assert_eq!(
            m.nodes[2],
            DeviceNode {
                path: "/dev/nvidia-caps/nvidia-cap23".into(),
                node_type: Some("c".into()),
                major: Some(237),
                minor: Some(23),
                file_mode: Some(0o444),
                ..DeviceNode::default()
            }
        );
        // The host's node, where it exists, is still named by its path.
        assert_eq!(
            m.nodes[1].host_path.as_deref(),
            Some("/dev/nvidia-caps/nvidia-cap21")
        );
        // A bad mode is an error, not a guess.
        cap(
            &f,
            "gpu1/mig/gi2/ci1/access",
            "DeviceFileMinor: 23\nDeviceFileMode: 99999\n",
        );
        let err = loc.mig(1, 2, 1).unwrap_err().to_string();
        assert!(
            err.contains("DeviceFileMode \"99999\" is not a file mode"),
            "{err}"
        );
    }

    #[test]
    fn the_caps_major_comes_from_the_character_devices_only() {
        let text = "Character devices:\n  1 mem\n 237 nvidia-caps\nBlock devices:\n  8 sd\n";
        assert_eq!(parse_char_major(text, "nvidia-caps"), Some(237));
        assert_eq!(parse_char_major(text, "sd"), None);
        assert_eq!(parse_char_major(text, "nvidia"), None);
        for odd in [
            "",
            "garbage",
            "Character devices:\nx nvidia-caps\n",
            "Character devices:\n99999999999 nvidia-caps\n",
        ] {
            assert_eq!(parse_char_major(odd, "nvidia-caps"), None, "{odd:?}");
        }
    }

    #[test]
    fn cap_parsing_good_and_malformed() {
        assert_eq!(parse_cap_minor("DeviceFileMinor: 7\n").unwrap(), 7);
        assert_eq!(
            parse_cap_minor("DeviceFileMode: 292\n  DeviceFileMinor :  12  \n").unwrap(),
            12
        );
        for (text, why) in [
            ("", "no DeviceFileMinor line"),
            ("DeviceFileMode: 292\n", "no DeviceFileMinor line"),
            ("DeviceFileMinor: -1\n", "\"-1\" is not a number"),
            ("DeviceFileMinor: 99999999999\n", "is not a number"),
            ("DeviceFileMinor:\n", "\"\" is not a number"),
            ("DeviceFileMinor: 1\nDeviceFileMinor: 2\n", "more than one"),
        ] {
            let err = parse_cap_minor(text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn oversized_cap_file_is_refused() {
        let f = fake(&[]);
        cap(&f, "gpu0/mig/gi1/access", &"x".repeat(10_000));
        let err = read_cap(
            &f.proc
                .join("driver/nvidia/capabilities/gpu0/mig/gi1/access"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("larger than 4096 bytes"), "{err}");
    }
}
