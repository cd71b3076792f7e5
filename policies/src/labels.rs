//! Labels: integrity × confidentiality, a four-element lattice.
//!
//! Invariants: labels are ordered by how *degraded* they are: `Trusted ⊑
//! Untrusted`, `Public ⊑ Private`, and pairs part by part, so `(Untrusted,
//! Public)` and `(Trusted, Private)` are incomparable. The join `⊔` is what
//! a derived value gets (the more tainted source, the more secret content);
//! the meet `⊓` is the greatest lower bound. Every lattice law is checked
//! exhaustively in the tests.
//!
//! Labels only degrade: a [`Labelled`] value's label can only be joined
//! upward ([`Labelled::taint`], [`Labelled::combine`]); no method lowers it,
//! and [`Labelled::map`] keeps it. [`Labelled::new`] gives a value its
//! *first* label, from provenance the caller tracked (the owner's config,
//! an agent's output); it is not a way to relabel something that already
//! had one, which is why there is no method that hands back the value and
//! its label apart (`tests::labelled_values_only_degrade`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Integrity {
    /// From the owner or a source the owner vouched for.
    Trusted,
    /// Anything a third party or an agent could have influenced.
    Untrusted,
}

/// How secret a value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidentiality {
    /// Anyone may read it.
    Public,
    /// Only private readers may.
    Private,
}

/// A label: integrity × confidentiality.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Label {
    /// Where it came from.
    pub integrity: Integrity,
    /// How secret it is.
    pub confidentiality: Confidentiality,
}

impl Label {
    /// The least label: trusted and public.
    pub const BOTTOM: Label = Label::new(Integrity::Trusted, Confidentiality::Public);
    /// The greatest label: untrusted and private.
    pub const TOP: Label = Label::new(Integrity::Untrusted, Confidentiality::Private);
    /// All four labels.
    pub const ALL: [Label; 4] = [
        Label::BOTTOM,
        Label::new(Integrity::Trusted, Confidentiality::Private),
        Label::new(Integrity::Untrusted, Confidentiality::Public),
        Label::TOP,
    ];

    /// A label from its parts.
    pub const fn new(integrity: Integrity, confidentiality: Confidentiality) -> Self {
        Self {
            integrity,
            confidentiality,
        }
    }

    /// Least upper bound: the label of a value derived from both.
    pub fn join(self, other: Label) -> Label {
        Label::new(
            self.integrity.max(other.integrity),
            self.confidentiality.max(other.confidentiality),
        )
    }

    /// Greatest lower bound.
    pub fn meet(self, other: Label) -> Label {
        Label::new(
            self.integrity.min(other.integrity),
            self.confidentiality.min(other.confidentiality),
        )
    }

    /// `self ⊑ other`: `other` is at least as degraded on both axes.
    pub fn flows_to(self, other: Label) -> bool {
        self.integrity <= other.integrity && self.confidentiality <= other.confidentiality
    }

    /// Is the integrity trusted?
    pub fn is_trusted(self) -> bool {
        self.integrity == Integrity::Trusted
    }

    /// Is the content private?
    pub fn is_private(self) -> bool {
        self.confidentiality == Confidentiality::Private
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = match self.integrity {
            Integrity::Trusted => "T",
            Integrity::Untrusted => "U",
        };
        let c = match self.confidentiality {
            Confidentiality::Public => "pub",
            Confidentiality::Private => "priv",
        };
        write!(f, "({i},{c})")
    }
}

/// A value with a label that can only go up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labelled<T> {
    value: T,
    label: Label,
}

impl<T> Labelled<T> {
    /// Gives a value its first label, from tracked provenance.
    pub fn new(value: T, label: Label) -> Self {
        Self { value, label }
    }

    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The label.
    pub fn label(&self) -> Label {
        self.label
    }

    /// The same value, its label joined with `with` (never lower).
    pub fn taint(self, with: Label) -> Self {
        Self {
            label: self.label.join(with),
            value: self.value,
        }
    }

    /// A value derived from this one alone keeps its label.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Labelled<U> {
        Labelled {
            value: f(self.value),
            label: self.label,
        }
    }

    /// A value derived from two takes the join of their labels.
    pub fn combine<U, V>(self, other: Labelled<U>, f: impl FnOnce(T, U) -> V) -> Labelled<V> {
        Labelled {
            label: self.label.join(other.label),
            value: f(self.value, other.value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: [Label; 4] = Label::ALL;

    #[test]
    fn order_is_a_partial_order() {
        for a in L {
            assert!(a.flows_to(a), "reflexive {a}");
            for b in L {
                if a.flows_to(b) && b.flows_to(a) {
                    assert_eq!(a, b, "antisymmetric");
                }
                for c in L {
                    if a.flows_to(b) && b.flows_to(c) {
                        assert!(a.flows_to(c), "transitive {a} {b} {c}");
                    }
                }
            }
        }
        // And it is not total: the two middle labels are incomparable.
        let (tp, up) = (L[1], L[2]);
        assert!(!tp.flows_to(up) && !up.flows_to(tp));
    }

    #[test]
    fn join_and_meet_are_least_upper_and_greatest_lower_bounds() {
        for a in L {
            for b in L {
                let j = a.join(b);
                let m = a.meet(b);
                assert!(a.flows_to(j) && b.flows_to(j));
                assert!(m.flows_to(a) && m.flows_to(b));
                for c in L {
                    if a.flows_to(c) && b.flows_to(c) {
                        assert!(j.flows_to(c), "least: {a} {b} {c}");
                    }
                    if c.flows_to(a) && c.flows_to(b) {
                        assert!(c.flows_to(m), "greatest: {a} {b} {c}");
                    }
                }
            }
            assert!(Label::BOTTOM.flows_to(a) && a.flows_to(Label::TOP));
        }
    }

    #[test]
    fn algebraic_laws_hold_for_every_label() {
        for a in L {
            assert_eq!(a.join(a), a, "join idempotent");
            assert_eq!(a.meet(a), a, "meet idempotent");
            for b in L {
                assert_eq!(a.join(b), b.join(a), "join commutative");
                assert_eq!(a.meet(b), b.meet(a), "meet commutative");
                assert_eq!(a.join(a.meet(b)), a, "absorption ⊔⊓");
                assert_eq!(a.meet(a.join(b)), a, "absorption ⊓⊔");
                assert_eq!(a.flows_to(b), a.join(b) == b, "a ⊑ b ⇔ a ⊔ b = b");
                assert_eq!(a.flows_to(b), a.meet(b) == a, "a ⊑ b ⇔ a ⊓ b = a");
                for c in L {
                    assert_eq!(a.join(b).join(c), a.join(b.join(c)), "join associative");
                    assert_eq!(a.meet(b).meet(c), a.meet(b.meet(c)), "meet associative");
                }
            }
        }
    }

    #[test]
    fn labelled_values_only_degrade() {
        for a in L {
            for b in L {
                let x = Labelled::new(1, a);
                let t = x.clone().taint(b);
                assert!(a.flows_to(t.label()) && b.flows_to(t.label()));
                let y = Labelled::new(2, b);
                let c = x.clone().combine(y, |p, q| p + q);
                assert_eq!(c.label(), a.join(b));
                assert_eq!(*c.value(), 3);
                assert_eq!(x.map(|v| v * 10).label(), a);
            }
        }
    }
}
