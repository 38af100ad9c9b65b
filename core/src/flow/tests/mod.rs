mod admission;
mod claim;
mod lifecycle;
mod priority;
mod sync;
