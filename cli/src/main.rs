//! `gpu-dra`: the admin CLI.

fn main() {}
