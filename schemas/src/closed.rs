//! Closed sets of names in the contract: an enum whose variants carry their wire names, with `as_str`,
//! `Display` (padding honoured), `ALL` and comparison with a `&str`, as clients that read the JSON compare.

/// Defines a closed set: `closed_set! { /// doc  pub enum Name { /// doc  Variant = "wire-name", … } }`.
macro_rules! closed_set {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $wire:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash,
            serde::Serialize, serde::Deserialize, schemars::JsonSchema,
        )]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $wire)] $variant ),+
        }

        impl $name {
            /// Every member, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        /// Compared with its wire name, as clients that read the JSON do.
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

pub(crate) use closed_set;

#[cfg(test)]
mod tests {
    closed_set! {
        /// A test set.
        pub enum Colour {
            /// Red.
            Red = "red",
            /// Sky blue.
            SkyBlue = "sky-blue",
        }
    }

    #[test]
    fn members_keep_their_wire_names_both_ways() {
        for c in Colour::ALL {
            let json = serde_json::to_value(c).expect("json");
            assert_eq!(json, c.as_str());
            let back: Colour = serde_json::from_value(json).expect("loads");
            assert_eq!(back, *c);
            let mp = rmp_serde::to_vec_named(c).expect("msgpack");
            assert_eq!(
                rmp_serde::from_slice::<Colour>(&mp).expect("msgpack loads"),
                *c
            );
        }
        assert_eq!(Colour::SkyBlue, "sky-blue");
        assert_eq!(format!("{:<9}|", Colour::Red), "red      |");
        let err = serde_json::from_value::<Colour>("green".into()).expect_err("not a member");
        assert!(err.to_string().contains("sky-blue"), "{err}");
    }
}
