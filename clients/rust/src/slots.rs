//! All or nothing across hash slots: [`Limiter::acquire_across_slots`] and
//! [`AsyncLimiter::acquire_across_slots`] take every item's cost, or none, even when the keys
//! sit in different slots of a cluster, where one RL.ACQUIRE.MULTI cannot reach them all.
//!
//! On one server (or when every key shares a slot) it is one `acquire_all`: atomic. On a
//! cluster the items are grouped by hash slot and taken group by group, in slot order; when a
//! later group refuses (or fails), the groups already taken are refunded, so a refused call
//! costs nothing. Between a take and its refund (one round trip) another call can see those
//! buckets short of the refunded tokens: that is the one window where a cluster is not atomic.
//!
//! Whether Redis is a cluster is not configured: a limiter on a cluster client goes group by
//! group from its first call; on another connection the first call sends every item at
//! once, and a `CROSSSLOT` reply marks the limiter's engine, so that call and every later one
//! go group by group (a single-node client on a cluster is a misconfiguration, decided by
//! the policy).
//!
//! A *shadow* item (Envoy's `shadow_mode`) is counted and reported but never refuses the call:
//! when only shadow items refuse, they are left out, take nothing, and the rest is asked again.
//!
//! A key's slot is `hashslot`'s ([`crate::key_slot`]). [`Across`] is the plan as steps
//! without I/O; `sync` and `asynch` send them through their own `acquire_all` and `refund`,
//! so the deny cache and the failure policy apply to each group unchanged.
//!
//! [`Limiter::acquire_across_slots`]: crate::Limiter::acquire_across_slots
//! [`AsyncLimiter::acquire_across_slots`]: crate::AsyncLimiter::acquire_across_slots

use std::collections::BTreeMap;

use redis::{ErrorKind, ServerErrorKind};

use crate::engine::{Engine, Target};
use crate::hashslot::key_slot;
use crate::types::{check_cost, Decision, Error, Limit, MultiDecision, Source};

/// One bucket of an [`acquire_across_slots`](crate::AsyncLimiter::acquire_across_slots) call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotItem<'a> {
    /// The bucket's key.
    pub key: &'a str,
    /// Its limit.
    pub limit: Limit,
    /// The tokens to take.
    pub cost: f64,
    /// Counted and reported, but its refusal does not refuse the call (Envoy's shadow mode).
    pub shadow: bool,
    /// A field of a bucket table instead of a key of its own: `(table key, field)`, sent as
    /// RL.HACQUIRE.MULTI; `key` is then the field's fallback key (`name:{i}:field`, under the
    /// table's hash tag), which the deny cache and the Lua path use.
    pub in_table: Option<(&'a str, &'a str)>,
}

impl<'a> SlotItem<'a> {
    /// An item that refuses the call when its bucket refuses.
    pub fn new(key: &'a str, limit: Limit, cost: f64) -> Self {
        SlotItem {
            key,
            limit,
            cost,
            shadow: false,
            in_table: None,
        }
    }

    /// The same item as the field `field` of the table `table`, with `key` its fallback key
    /// (as [`crate::AsyncTable::key`] and [`crate::AsyncTable::fallback_key`] name them).
    #[must_use]
    pub fn in_table(mut self, table: &'a str, field: &'a str) -> Self {
        self.in_table = Some((table, field));
        self
    }

    /// The bucket as the engine names it.
    fn target(&self) -> Target<'a> {
        match self.in_table {
            Some((table, field)) => Target::Field {
                table,
                field,
                fallback_key: self.key,
            },
            None => Target::Key(self.key),
        }
    }

    /// The same item in shadow mode.
    #[must_use]
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }
}

/// What became of one item.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SlotOutcome {
    /// Its cost was taken and stays taken.
    Taken(Decision),
    /// It refused (not a shadow item), so nothing was taken; `None` when the deny cache
    /// refused it without asking Redis.
    Refused(Option<Decision>),
    /// A shadow item that refused: it took nothing, and the others went on without it.
    ShadowRefused(Option<Decision>),
    /// Not taken because another item refused: its decision alone (allowed, or taken then
    /// refunded), or `None` when its group was never asked.
    NotTaken(Option<Decision>),
}

impl SlotOutcome {
    /// The decision Redis (or the policy) gave this item, if it was asked.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            SlotOutcome::Taken(d) => Some(d),
            SlotOutcome::Refused(d) | SlotOutcome::ShadowRefused(d) | SlotOutcome::NotTaken(d) => {
                d.as_ref()
            }
        }
    }
}

/// The answer of `acquire_across_slots`.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotsDecision {
    /// Whether every item's cost was taken (shadow items that refused aside).
    pub allowed: bool,
    /// The refusing group's longest wait; -1 if an item can never succeed; 0 if allowed.
    pub retry_after_ms: i64,
    /// One outcome per item, in the items' order.
    pub outcomes: Vec<SlotOutcome>,
    /// Who decided each `acquire_all` sent, in order: a `Closed` among them means Redis
    /// could not decide (the failure policy refused).
    pub sources: Vec<Source>,
}

/// Whether `e` says the keys of one command span several slots.
fn is_crossslot(e: &Error) -> bool {
    match e {
        Error::Redis(e) => {
            e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot)
                || e.code() == Some("CROSSSLOT")
                || e.to_string().contains("CrossSlot")
        }
        _ => false,
    }
}

/// `(bucket, limit, cost)`, as the limiter's multi call and `refund` take them.
pub(crate) type Args<'a> = Vec<(Target<'a>, Limit, f64)>;

/// What an [`Across`] wants next.
pub(crate) enum AcrossStep<'a> {
    /// `acquire_all` of these, its result handed to [`Across::answer`].
    Ask(Args<'a>),
    /// `refund` of each of these (a failed refund is logged), then [`Across::refunded`].
    Refund(Args<'a>),
    /// The call's result.
    Done(Result<SlotsDecision, Error>),
}

/// One `acquire_across_slots` call as steps without I/O.
pub(crate) struct Across<'a, 'e> {
    engine: &'e Engine,
    items: &'a [SlotItem<'a>],
    /// The groups not yet asked, last first.
    groups: Vec<Vec<usize>>,
    /// The group being asked, without the shadow items that refused.
    asking: Vec<usize>,
    by_slot: bool,
    taken: Vec<usize>,
    outcomes: Vec<SlotOutcome>,
    sources: Vec<Source>,
    /// What the call ends with once the refund step is done.
    ending: Option<Result<SlotsDecision, Error>>,
}

impl<'a, 'e> Across<'a, 'e> {
    /// A plan for `items`, grouped by slot if the engine has learnt it talks to a cluster.
    ///
    /// # Errors
    /// [`Error::Invalid`] for no items or a bad cost.
    pub(crate) fn new(engine: &'e Engine, items: &'a [SlotItem<'a>]) -> Result<Self, Error> {
        if items.is_empty() {
            return Err(Error::Invalid(
                "acquire_across_slots needs at least one item",
            ));
        }
        for item in items {
            check_cost(item.cost)?;
        }
        let mut plan = Across {
            engine,
            items,
            groups: Vec::new(),
            asking: Vec::new(),
            by_slot: false,
            taken: Vec::new(),
            outcomes: vec![SlotOutcome::NotTaken(None); items.len()],
            sources: Vec::new(),
            ending: None,
        };
        plan.group(engine.is_cluster());
        Ok(plan)
    }

    /// One group of every item, or one per slot in slot order.
    fn group(&mut self, by_slot: bool) {
        self.by_slot = by_slot;
        // Table fields and keys go in separate calls (RL.HACQUIRE.MULTI, RL.ACQUIRE.MULTI).
        let mut groups: BTreeMap<(u16, bool), Vec<usize>> = BTreeMap::new();
        for (i, item) in self.items.iter().enumerate() {
            let slot = if by_slot {
                key_slot(item.key.as_bytes())
            } else {
                0
            };
            groups
                .entry((slot, item.in_table.is_some()))
                .or_default()
                .push(i);
        }
        self.groups = groups.into_values().rev().collect();
    }

    /// The first step.
    pub(crate) fn start(&mut self) -> AcrossStep<'a> {
        self.next_group()
    }

    fn args(&self, indexes: &[usize]) -> Args<'a> {
        indexes
            .iter()
            .filter_map(|&i| self.items.get(i))
            .map(|it| (it.target(), it.limit, it.cost))
            .collect()
    }

    fn next_group(&mut self) -> AcrossStep<'a> {
        match self.groups.pop() {
            Some(group) => {
                self.asking = group;
                AcrossStep::Ask(self.args(&self.asking))
            }
            None => AcrossStep::Done(Ok(SlotsDecision {
                allowed: true,
                retry_after_ms: 0,
                outcomes: std::mem::take(&mut self.outcomes),
                sources: std::mem::take(&mut self.sources),
            })),
        }
    }

    /// The next step, given what `acquire_all` of the last `Ask` returned.
    pub(crate) fn answer(&mut self, result: Result<MultiDecision, Error>) -> AcrossStep<'a> {
        let multi = match result {
            Ok(multi) => multi,
            Err(e) if !self.by_slot && self.taken.is_empty() && is_crossslot(&e) => {
                // A cluster: nothing was taken, so start again group by group.
                self.engine.set_cluster();
                self.group(true);
                return self.next_group();
            }
            Err(e) => return self.end(Err(e)),
        };
        self.sources.push(multi.source);
        if multi.allowed {
            for (pos, &i) in self.asking.iter().enumerate() {
                if let (Some(slot), Some(d)) = (self.outcomes.get_mut(i), multi.decisions.get(pos))
                {
                    *slot = SlotOutcome::Taken(*d);
                }
            }
            self.taken.append(&mut self.asking);
            return self.next_group();
        }
        // Which items refused: each decision says so; the deny cache knows only the first.
        let refusing: Vec<usize> = if multi.decisions.is_empty() {
            multi
                .refused_index
                .and_then(|r| self.asking.get(r).copied())
                .into_iter()
                .collect()
        } else {
            self.asking
                .iter()
                .zip(&multi.decisions)
                .filter(|(_, d)| !d.allowed)
                .map(|(&i, _)| i)
                .collect()
        };
        let decision_of = |i: usize| {
            self.asking
                .iter()
                .position(|&a| a == i)
                .and_then(|p| multi.decisions.get(p).copied())
        };
        let is_shadow = |i: usize| self.items.get(i).is_some_and(|it| it.shadow);
        if !refusing.is_empty() && refusing.iter().all(|&i| is_shadow(i)) {
            for &i in &refusing {
                let d = decision_of(i);
                if let Some(slot) = self.outcomes.get_mut(i) {
                    *slot = SlotOutcome::ShadowRefused(d);
                }
            }
            self.asking.retain(|i| !refusing.contains(i));
            if self.asking.is_empty() {
                return self.next_group();
            }
            return AcrossStep::Ask(self.args(&self.asking));
        }
        for &i in &self.asking {
            let d = decision_of(i);
            let outcome = match (refusing.contains(&i), is_shadow(i)) {
                (true, true) => SlotOutcome::ShadowRefused(d),
                (true, false) => SlotOutcome::Refused(d),
                (false, _) => SlotOutcome::NotTaken(d),
            };
            if let Some(slot) = self.outcomes.get_mut(i) {
                *slot = outcome;
            }
        }
        let retry_after_ms = multi.retry_after_ms;
        self.end(Ok(SlotsDecision {
            allowed: false,
            retry_after_ms,
            outcomes: Vec::new(),
            sources: Vec::new(),
        }))
    }

    /// Ends with `result`, giving back what earlier groups took first.
    fn end(&mut self, result: Result<SlotsDecision, Error>) -> AcrossStep<'a> {
        if self.taken.is_empty() {
            self.ending = Some(result);
            return self.refunded();
        }
        let taken = std::mem::take(&mut self.taken);
        for &i in &taken {
            if let Some(slot) = self.outcomes.get_mut(i) {
                if let SlotOutcome::Taken(d) = *slot {
                    *slot = SlotOutcome::NotTaken(Some(d));
                }
            }
        }
        self.ending = Some(result);
        AcrossStep::Refund(self.args(&taken))
    }

    /// The last step, once the refunds asked for are done.
    pub(crate) fn refunded(&mut self) -> AcrossStep<'a> {
        let result = match self.ending.take() {
            Some(Ok(mut decision)) => {
                decision.outcomes = std::mem::take(&mut self.outcomes);
                decision.sources = std::mem::take(&mut self.sources);
                Ok(decision)
            }
            Some(Err(e)) => Err(e),
            None => Err(Error::Reply("acquire_across_slots: no result".into())),
        };
        AcrossStep::Done(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{OnError, Options};

    fn decision(allowed: bool, source: Source) -> Decision {
        Decision {
            allowed,
            remaining: 0,
            retry_after_ms: if allowed { 0 } else { 500 },
            reset_after_ms: 0,
            limit: Limit::new(1.0, 1.0).unwrap(),
            source,
        }
    }

    fn multi(each: &[bool]) -> MultiDecision {
        let refused_index = each.iter().position(|a| !a);
        MultiDecision {
            allowed: refused_index.is_none(),
            refused_index,
            retry_after_ms: if refused_index.is_some() { 500 } else { 0 },
            decisions: each.iter().map(|&a| decision(a, Source::Redis)).collect(),
            source: Source::Redis,
        }
    }

    fn keys(step: &AcrossStep<'_>) -> Vec<String> {
        match step {
            AcrossStep::Ask(args) | AcrossStep::Refund(args) => {
                args.iter().map(|(t, _, _)| t.key().to_string()).collect()
            }
            AcrossStep::Done(_) => Vec::new(),
        }
    }

    #[test]
    fn a_crossslot_reply_regroups_by_slot_and_is_remembered() {
        let engine = Engine::new(Options::new(OnError::Closed), false);
        let limit = Limit::new(1.0, 1.0).unwrap();
        let items = [
            SlotItem::new("a", limit, 1.0),
            SlotItem::new("b", limit, 1.0),
        ];
        let mut plan = Across::new(&engine, &items).unwrap();
        let step = plan.start();
        assert_eq!(keys(&step), ["a", "b"]);
        let crossslot =
            redis::RedisError::from((ErrorKind::Server(ServerErrorKind::CrossSlot), "CROSSSLOT"));
        let step = plan.answer(Err(Error::Redis(crossslot)));
        // "b" (slot 3300) before "a" (15495).
        assert_eq!(keys(&step), ["b"]);
        assert!(engine.is_cluster());
        let mut again = Across::new(&engine, &items).unwrap();
        assert_eq!(keys(&again.start()), ["b"]);
    }

    #[test]
    fn only_shadow_items_refusing_are_left_out_and_the_rest_asked_again() {
        let engine = Engine::new(Options::new(OnError::Closed), false);
        let limit = Limit::new(1.0, 1.0).unwrap();
        let items = [
            SlotItem::new("a", limit, 1.0).shadow(),
            SlotItem::new("b", limit, 1.0),
        ];
        let mut plan = Across::new(&engine, &items).unwrap();
        plan.start();
        let step = plan.answer(Ok(multi(&[false, true])));
        assert_eq!(keys(&step), ["b"]);
        let AcrossStep::Done(Ok(d)) = plan.answer(Ok(multi(&[true]))) else {
            panic!("done")
        };
        assert!(d.allowed);
        assert!(matches!(d.outcomes[0], SlotOutcome::ShadowRefused(Some(_))));
        assert!(matches!(d.outcomes[1], SlotOutcome::Taken(_)));
        assert_eq!(d.sources, [Source::Redis, Source::Redis]);
    }

    #[test]
    fn table_fields_and_keys_are_asked_in_separate_calls() {
        let engine = Engine::new(Options::new(OnError::Closed), false);
        let limit = Limit::new(1.0, 1.0).unwrap();
        let items = [
            SlotItem::new("t:{0}:f", limit, 1.0).in_table("t:{0}", "f"),
            SlotItem::new("k", limit, 1.0),
            SlotItem::new("t:{1}:g", limit, 1.0).in_table("t:{1}", "g"),
        ];
        let mut plan = Across::new(&engine, &items).unwrap();
        let AcrossStep::Ask(first) = plan.start() else {
            panic!("ask")
        };
        assert_eq!(first, vec![(Target::Key("k"), limit, 1.0)]);
        let AcrossStep::Ask(second) = plan.answer(Ok(multi(&[true]))) else {
            panic!("ask")
        };
        let field = |table, field, fallback_key| Target::Field {
            table,
            field,
            fallback_key,
        };
        assert_eq!(
            second,
            vec![
                (field("t:{0}", "f", "t:{0}:f"), limit, 1.0),
                (field("t:{1}", "g", "t:{1}:g"), limit, 1.0),
            ]
        );
    }

    #[test]
    fn a_later_group_refusing_or_failing_refunds_the_groups_taken() {
        let limit = Limit::new(1.0, 1.0).unwrap();
        let items = [
            SlotItem::new("b", limit, 1.0),
            SlotItem::new("a", limit, 1.0),
        ];
        for fails in [false, true] {
            let engine = Engine::new(Options::new(OnError::Closed), false);
            engine.set_cluster();
            let mut plan = Across::new(&engine, &items).unwrap();
            assert_eq!(keys(&plan.start()), ["b"]);
            assert_eq!(keys(&plan.answer(Ok(multi(&[true])))), ["a"]);
            let result = if fails {
                Err(Error::Reply("WRONGTYPE".into()))
            } else {
                Ok(multi(&[false]))
            };
            let step = plan.answer(result);
            assert!(matches!(step, AcrossStep::Refund(_)));
            assert_eq!(keys(&step), ["b"]);
            match plan.refunded() {
                AcrossStep::Done(Ok(d)) => {
                    assert!(!fails);
                    assert!(!d.allowed);
                    assert_eq!(d.retry_after_ms, 500);
                    assert!(matches!(d.outcomes[0], SlotOutcome::NotTaken(Some(_))));
                    assert!(matches!(d.outcomes[1], SlotOutcome::Refused(Some(_))));
                }
                AcrossStep::Done(Err(_)) => assert!(fails),
                _ => panic!("done"),
            }
        }
    }
}
