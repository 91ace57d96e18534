//! Shared helpers: a deterministic entropy source, a directory, and a loop
//! that runs an initiator against a target in memory.
#![allow(dead_code)]

use std::sync::Arc;

use iscsi_login::{
    AuthRequirement, ChapCredentials, InitiatorLogin, InitiatorStep, LoginError, LoginOutcome,
    LoginState, LoginStatus, Portal, StaticDirectory, StaticTarget, TargetLimits, TargetLogin,
    TargetLoginConfig, TransportKind,
};

pub const TARGET: &str = "iqn.2024-01.org.ironsan:disk1";
pub const INITIATOR: &str = "iqn.2024-01.org.ironsan:host1";

/// xorshift64: deterministic bytes for tests.
pub struct TestRng(pub u64);

impl TestRng {
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            *b = self.0 as u8;
        }
    }
}

pub fn directory(auth: AuthRequirement, discovery_auth: AuthRequirement) -> StaticDirectory {
    StaticDirectory {
        targets: vec![
            StaticTarget {
                name: TARGET.into(),
                alias: Some("disk one".into()),
                allowed_initiators: vec![INITIATOR.into(), "iqn.2024-01.org.ironsan:host2".into()],
                auth,
                portals: vec![
                    Portal {
                        address: "192.0.2.10:3260".parse().unwrap(),
                        tpgt: 1,
                    },
                    Portal {
                        address: "[2001:db8::10]:3260".parse().unwrap(),
                        tpgt: 1,
                    },
                ],
            },
            StaticTarget {
                name: "iqn.2024-01.org.ironsan:disk2".into(),
                alias: None,
                allowed_initiators: vec![],
                auth: AuthRequirement::None,
                portals: vec![Portal {
                    address: "192.0.2.11:3261".parse().unwrap(),
                    tpgt: 2,
                }],
            },
        ],
        discovery_auth,
    }
}

pub fn chap(user: &str, secret: &str) -> ChapCredentials {
    ChapCredentials::new(user, secret.as_bytes().to_vec())
}

pub fn target_config(
    dir: StaticDirectory,
    limits: TargetLimits,
    transport: TransportKind,
) -> TargetLoginConfig {
    TargetLoginConfig {
        portal_group_tag: 1,
        existing_session: None,
        transport,
        limits,
        directory: Arc::new(dir),
    }
}

#[derive(Debug)]
pub enum RunResult {
    Ok {
        outcome: Box<LoginOutcome>,
        tsih: u16,
        initiator: Box<InitiatorStep>,
    },
    TargetFailed(LoginStatus, Result<InitiatorStep, LoginError>),
    InitiatorFailed(LoginError),
}

/// Runs a whole login in memory; the target assigns TSIH 0x1234.
pub fn run(initiator: &mut InitiatorLogin, target: &mut TargetLogin, seed: u64) -> RunResult {
    let mut rng = TestRng(seed | 1);
    let mut req = initiator.first_request();
    for _ in 0..64 {
        let mut step = target.on_request(&req, &mut |b: &mut [u8]| rng.fill(b));
        match step.state {
            LoginState::Failed => {
                let r = initiator.on_response(&step.response, &mut |b: &mut [u8]| rng.fill(b));
                return RunResult::TargetFailed(step.response.status(), r);
            }
            LoginState::Complete(outcome) => {
                step.response.header.tsih = 0x1234;
                match initiator.on_response(&step.response, &mut |b: &mut [u8]| rng.fill(b)) {
                    Ok(s @ InitiatorStep::Complete { .. }) => {
                        return RunResult::Ok {
                            outcome,
                            tsih: 0x1234,
                            initiator: Box::new(s),
                        }
                    }
                    Ok(other) => panic!("initiator did not complete: {other:?}"),
                    Err(e) => return RunResult::InitiatorFailed(e),
                }
            }
            LoginState::Continue => {
                match initiator.on_response(&step.response, &mut |b: &mut [u8]| rng.fill(b)) {
                    Ok(InitiatorStep::Send(next)) => req = next,
                    Ok(c) => panic!("initiator completed before the target: {c:?}"),
                    Err(e) => return RunResult::InitiatorFailed(e),
                }
            }
        }
    }
    panic!("login did not finish in 64 exchanges");
}
