//! What a decision returns: the [`Verdict`], who made it, the [`Receipt`] of its charge, and the
//! script's reply read back.

use ratewell::{Decision, LayeredDecision};
use redis::Value;

use crate::error::Error;

/// Why the failover decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailoverReason {
    /// The server did not answer within the timeout.
    Timeout,
    /// The connection was down (refused, reset, or not yet back after a timeout).
    Down,
    /// The server answered with an error or a reply that is not the script's (a server that is
    /// not Redis, or one that lies).
    BadReply,
}

/// Who made a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The server's script: the shared, exact decision.
    Server,
    /// The configured [`Failover`](crate::Failover), for this reason.
    Failover(FailoverReason),
}

/// A decision and who made it.
#[derive(Clone, Debug)]
pub struct Verdict {
    pub(crate) decision: LayeredDecision,
    pub(crate) source: Source,
    pub(crate) receipt: Option<Receipt>,
}

impl Verdict {
    /// `true` if the request may proceed.
    pub fn is_admitted(&self) -> bool {
        self.decision.is_admitted()
    }

    /// The layered decision: combined (`decision()`) and per layer (`layer(i)`), as in process.
    pub fn layered(&self) -> &LayeredDecision {
        &self.decision
    }

    /// The combined decision.
    pub fn decision(&self) -> Decision {
        self.decision.decision()
    }

    /// Who decided.
    pub fn source(&self) -> Source {
        self.source
    }

    /// What [`RedisLimiter::refund`](crate::RedisLimiter::refund) needs to take an admitted charge back (`None` for a
    /// rejection, a peek, or a failover decision).
    pub fn receipt(&self) -> Option<&Receipt> {
        self.receipt.as_ref()
    }
}

/// An admitted charge on the server, to take back with [`RedisLimiter::refund`](crate::RedisLimiter::refund).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    pub(crate) cost: u32,
    pub(crate) groups: Vec<Charged>,
}

impl Receipt {
    /// The cost charged.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// The same charge with `cost` units to give back (a part of it).
    pub(crate) fn with_cost(&self, cost: u32) -> Receipt {
        if cost >= self.cost {
            return self.clone();
        }
        // Part of the charge: the state before it must not be restored (that would give back
        // all of it), so the receipts keep only the state the charge stored.
        let groups = self
            .groups
            .iter()
            .map(|g| Charged {
                states: g.states.iter().map(|s| stored_part(s).to_vec()).collect(),
                ..g.clone()
            })
            .collect();
        Receipt { cost, groups }
    }
}

/// One script call's charge: its layers, keys, and the states the charge stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Charged {
    pub(crate) layers: Vec<usize>,
    pub(crate) keys: Vec<String>,
    /// Per layer, the receipt the script returned: the state stored, `|`, the state replaced
    /// (opaque bytes: `decide.lua` writes a state as a count byte and that many doubles).
    pub(crate) states: Vec<Vec<u8>>,
}

/// `(now_us, admitted, per item [outcome, remaining, reset, wait, replenish], per item receipt)`
/// of a per-call decision.
#[allow(clippy::type_complexity)]
pub(crate) fn parse_call_reply(
    reply: Value,
    items: usize,
) -> Result<(u64, bool, Vec<[i64; 5]>, Vec<Vec<u8>>), Error> {
    let now = match &reply {
        Value::Array(v) => match v.first() {
            Some(Value::Int(now)) => u64::try_from(*now).ok(),
            _ => None,
        },
        _ => None,
    };
    let now = now.ok_or_else(|| Error::BadReply("no time in the script's reply".into()))?;
    let (admitted, fields, receipts) = parse_reply(reply, items)?;
    Ok((now, admitted, fields, receipts))
}

/// `(admitted, per layer [outcome, remaining, reset, wait, replenish], per layer receipt)`.
#[allow(clippy::type_complexity)]
pub(crate) fn parse_reply(
    reply: Value,
    layers: usize,
) -> Result<(bool, Vec<[i64; 5]>, Vec<Vec<u8>>), Error> {
    let bad = |what: &str| Error::BadReply(format!("{what} in the script's reply"));
    let Value::Array(items) = reply else { return Err(bad("not an array")) };
    if items.len() != 2 + 6 * layers {
        return Err(bad("wrong length"));
    }
    let int = |v: &Value| match v {
        Value::Int(i) => Ok(*i),
        _ => Err(bad("not an integer")),
    };
    let admitted = int(&items[1])? == 1;
    let mut fields = Vec::with_capacity(layers);
    let mut states = Vec::with_capacity(layers);
    for l in 0..layers {
        let at = 2 + 6 * l;
        let mut f = [0i64; 5];
        for (j, slot) in f.iter_mut().enumerate() {
            *slot = int(&items[at + j])?;
            if *slot < 0 {
                return Err(bad("a negative field"));
            }
        }
        if f[0] > 2 {
            return Err(bad("an unknown outcome"));
        }
        states.push(match &items[at + 5] {
            Value::BulkString(b) => b.clone(),
            Value::SimpleString(s) => s.clone().into_bytes(),
            Value::Nil => Vec::new(),
            _ => return Err(bad("a state that is not a string")),
        });
        fields.push(f);
    }
    Ok((admitted, fields, states))
}

/// The part of a receipt that is the state the charge stored (what a refund of part of the
/// charge keeps): a binary state's own length (a count byte and that many 8-byte doubles), or a
/// text state up to its `|`.
pub(crate) fn stored_part(receipt: &[u8]) -> &[u8] {
    match receipt.first() {
        Some(&k @ 1..=3) => &receipt[..receipt.len().min(1 + 8 * usize::from(k))],
        _ => receipt.split(|&b| b == b'|').next().unwrap_or_default(),
    }
}
