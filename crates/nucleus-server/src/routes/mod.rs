//! Routes that live in their own files (the OpenAI routes are still in the crate root).

pub(crate) mod page;
