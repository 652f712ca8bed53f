//! Integration tests through the `cardproof` binary. One test binary (links once).

mod artifact;
mod bad_input;
mod card;
mod delta_rule;
mod dequant_reference;
mod fail_closed;
mod fixtures;
mod hash;
mod hub;
mod hub_server;
mod hybrid;
mod inspect;
mod kld;
mod kv_cache;
mod lint;
mod measure;
mod moe;
mod native_llamacpp;
mod output_contract;
mod output_schemas;
mod outputs;
mod schema;
mod support;
mod transformers;
mod verify;
mod written_documents;
