mod lifecycle;
mod sync;
