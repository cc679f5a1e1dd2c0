//! Input rate limits: a global rate that is never exceeded, and a per-key (per-cluster) rate so one
//! cluster's flood can't starve the others.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};
use serde::{Deserialize, Serialize};

/// Rate limit settings of one consumer. `0` switches a limit off.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Messages per second this consumer takes in, all keys together.
    pub per_second: u32,
    /// Burst above the steady rate (defaults to one second's worth when 0).
    pub burst: u32,
    /// Messages per second from any one key (cluster).
    pub per_key_per_second: u32,
    /// Burst for one key (defaults to one second's worth when 0).
    pub per_key_burst: u32,
}

fn quota(rate: u32, burst: u32) -> Option<Quota> {
    let rate = NonZeroU32::new(rate)?;
    let burst = NonZeroU32::new(burst).unwrap_or(rate);
    Some(Quota::per_second(rate).allow_burst(burst))
}

/// Whether a message may go on now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Go.
    Go,
    /// This key is over its rate: come back after this long.
    Later(Duration),
}

/// A global and a keyed limiter.
#[derive(Debug)]
pub struct Limiter {
    global: Option<DefaultDirectRateLimiter>,
    keyed: Option<DefaultKeyedRateLimiter<String>>,
    clock: DefaultClock,
}

impl Limiter {
    /// Builds the limiters a config asks for.
    pub fn new(config: &Config) -> Self {
        Limiter {
            global: quota(config.per_second, config.burst).map(governor::RateLimiter::direct),
            keyed: quota(config.per_key_per_second, config.per_key_burst)
                .map(governor::RateLimiter::keyed),
            clock: DefaultClock::default(),
        }
    }

    /// Whether any limit is configured.
    pub fn is_active(&self) -> bool {
        self.global.is_some() || self.keyed.is_some()
    }

    /// Checks the key's own rate (without waiting). A message told to come back later has not used up any
    /// of the global rate.
    pub fn check_key(&self, key: &str) -> Decision {
        let Some(keyed) = &self.keyed else {
            return Decision::Go;
        };
        match keyed.check_key(&key.to_string()) {
            Ok(()) => Decision::Go,
            Err(not_until) => Decision::Later(not_until.wait_time_from(self.clock.now())),
        }
    }

    /// Waits until the global rate allows one more message.
    pub async fn until_ready(&self) {
        if let Some(global) = &self.global {
            global.until_ready().await;
        }
    }

    /// Forgets keys that haven't been seen for a while (bounded memory with many clusters).
    pub fn shrink(&self) {
        if let Some(keyed) = &self.keyed {
            keyed.retain_recent();
            keyed.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flooding_key_is_held_back_and_others_are_not() {
        let l = Limiter::new(&Config {
            per_key_per_second: 10,
            per_key_burst: 5,
            ..Default::default()
        });
        let mut go = 0;
        for _ in 0..100 {
            if l.check_key("flood") == Decision::Go {
                go += 1;
            }
        }
        // Only the burst passes at once (plus at most one more that the clock refilled meanwhile).
        assert!((5..=6).contains(&go), "{go}");
        assert_eq!(l.check_key("quiet"), Decision::Go);
        assert!(matches!(l.check_key("flood"), Decision::Later(d) if d > Duration::ZERO));
    }

    #[test]
    fn no_limits_means_go() {
        let l = Limiter::new(&Config::default());
        assert!(!l.is_active());
        assert_eq!(l.check_key("x"), Decision::Go);
    }
}
