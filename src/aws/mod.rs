//! Everything that talks to AWS. Controllers use the traits in `provider`, never
//! an SDK client; every call goes through [`client::AwsClient`], the one door.

pub mod client;
pub mod clients;
