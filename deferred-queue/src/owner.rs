//! The owner's authority, as a value.
//!
//! Invariants:
//! - An [`Owner`] exists only as the result of [`Owner::verify`], which runs
//!   the caller's [`CredentialCheck`] on a presented credential. Its field is
//!   private; it has no `Default`, no `From`, and no `Deserialize`, so
//!   neither an agent's request nor a door's JSON nor a stored row can be
//!   turned into one: the compiler holds that, and
//!   `tests::verify_yields_an_owner_only_for_the_right_credential` that a
//!   wrong credential yields none.
//! - Approving and rejecting take an `Owner` (see [`crate::Event`]), so the
//!   type system keeps those events out of reach of any code path that did
//!   not check a credential.
//! - States record only the owner's name (a `String`): reading a stored
//!   state back never mints authority (a state with an approval reads back
//!   from JSON, which an `Owner` could not: `machine::tests::states_round_trip_through_json`).

use std::fmt;

/// Checks a presented credential against the owner's. Implemented by the
/// supervisor's authentication code (the dashboard's session, the CLI's
/// token); tests implement a fake.
pub trait CredentialCheck {
    /// What the person presents.
    type Credential: ?Sized;
    /// Why a credential was refused.
    type Error;

    /// The owner's name when `credential` is the owner's, an error otherwise.
    fn check(&self, credential: &Self::Credential) -> Result<String, Self::Error>;
}

/// Proof that the owner's credential was checked. See the module note.
#[derive(Clone, PartialEq, Eq)]
pub struct Owner {
    name: String,
}

impl Owner {
    /// The only way to make an `Owner`: check `credential` with `checker`.
    /// Call it where the person's request arrives (dashboard, CLI), never
    /// on a path an agent or the door can reach.
    pub fn verify<C: CredentialCheck>(
        checker: &C,
        credential: &C::Credential,
    ) -> Result<Owner, C::Error> {
        checker.check(credential).map(|name| Owner { name })
    }

    /// The owner's name, for the record.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Owner").field(&self.name).finish()
    }
}

/// ```
/// // Control for the next two: these checks compile for a stored state.
/// fn needs<T: serde::de::DeserializeOwned>() {}
/// needs::<deferred_queue::State>();
/// let _ = deferred_queue::Owner::name;
/// ```
///
/// ```compile_fail
/// // The field is private: no struct literal outside this crate.
/// let _ = deferred_queue::Owner { name: "mallory".into() };
/// ```
///
/// ```compile_fail
/// // No Deserialize: a request body cannot become an Owner.
/// fn needs<T: serde::de::DeserializeOwned>() {}
/// needs::<deferred_queue::Owner>();
/// ```
///
/// ```compile_fail
/// // No Default either.
/// let _: deferred_queue::Owner = Default::default();
/// ```
#[doc(hidden)]
pub fn _owner_cannot_be_forged() {}

#[cfg(test)]
mod tests {
    use super::*;

    struct Token(&'static str);

    impl CredentialCheck for Token {
        type Credential = str;
        type Error = &'static str;

        fn check(&self, credential: &str) -> Result<String, &'static str> {
            if credential == self.0 {
                Ok("owner".into())
            } else {
                Err("wrong credential")
            }
        }
    }

    #[test]
    fn verify_yields_an_owner_only_for_the_right_credential() {
        let checker = Token("s3cret");
        assert_eq!(Owner::verify(&checker, "s3cret").unwrap().name(), "owner");
        assert_eq!(Owner::verify(&checker, "guess"), Err("wrong credential"));
    }
}
