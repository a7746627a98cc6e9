//! `gpu-kubelet-plugin` entry point.

fn main() {}
