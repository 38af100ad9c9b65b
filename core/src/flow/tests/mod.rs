mod admission;
mod claim;
mod lifecycle;
mod sync;
