mod admission;
mod lifecycle;
mod sync;
