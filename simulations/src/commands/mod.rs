//! One file per subcommand.

pub(crate) mod design;
pub(crate) mod merge;
pub(crate) mod run;
pub(crate) mod slurm;
pub(crate) mod zi;
