//! When to tighten and when to relax: the backpressure coordinator.
//!
//! Pure timing logic over ticks (1 tick = 1 ms), driven by whoever owns the clock:
//!
//! - [`report_busy`](Coordinator::report_busy): the server said "busy". Always restarts the
//!   quiet timer; answers whether to upgrade now — yes for the first upgrade, and after that
//!   only once `upgrade_cooldown` ticks have passed since the last one.
//! - [`tick`](Coordinator::tick): time passes. Answers whether to downgrade now — yes when
//!   upgrades are pending and the server has been quiet for `downgrade_after` ticks; the quiet
//!   timer then starts again, so each further quiet period undoes one more level.
//!
//! The converging controller says after each decision whether anything is left to relax
//! ([`set_pending`](Coordinator::set_pending)); it is then asked again every quiet period.
//!
//! Counters saturate rather than overflow, however large a tick.

/// Timing parameters, in ticks (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The least time between two upgrades.
    pub upgrade_cooldown: u64,
    /// The quiet time after which one upgrade is undone.
    pub downgrade_after: u64,
}

/// The coordinator; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Coordinator {
    timing: Timing,
    /// Ticks since the last upgrade; `None` before the first.
    since_upgrade: Option<u64>,
    /// Ticks since the last busy signal (or the last downgrade).
    quiet: u64,
    /// Upgrades not yet undone.
    pending: u32,
}

impl Coordinator {
    /// A coordinator that has seen nothing yet.
    pub fn new(timing: Timing) -> Self {
        Coordinator {
            timing,
            since_upgrade: None,
            quiet: 0,
            pending: 0,
        }
    }

    /// Changes the timing; it applies from the next signal or tick.
    pub fn set_timing(&mut self, timing: Timing) {
        self.timing = timing;
    }

    /// The server said "busy". True: upgrade now (counted as pending; call
    /// [`upgrade_skipped`](Self::upgrade_skipped) if the upgrade turned out to change nothing).
    pub fn report_busy(&mut self) -> bool {
        self.quiet = 0;
        let cooled = self
            .since_upgrade
            .is_none_or(|since| since >= self.timing.upgrade_cooldown);
        if cooled {
            self.since_upgrade = Some(0);
            self.pending = self.pending.saturating_add(1);
        }
        cooled
    }

    /// The upgrade allowed by the last `report_busy` changed nothing: nothing to undo later.
    pub fn upgrade_skipped(&mut self) {
        self.pending = self.pending.saturating_sub(1);
    }

    /// Whether anything is left to relax: the converging controller relaxes every quiet period
    /// while any key is limited, however many decisions limited them.
    pub fn set_pending(&mut self, pending: bool) {
        self.pending = u32::from(pending);
    }

    /// `ticks` have passed. True: undo one upgrade now.
    pub fn tick(&mut self, ticks: u64) -> bool {
        if let Some(since) = &mut self.since_upgrade {
            *since = since.saturating_add(ticks);
        }
        if self.pending == 0 {
            return false;
        }
        self.quiet = self.quiet.saturating_add(ticks);
        if self.quiet >= self.timing.downgrade_after {
            self.quiet = 0;
            self.pending -= 1;
            return true;
        }
        false
    }

    #[cfg(test)]
    /// Upgrades not yet undone.
    pub fn pending(&self) -> u32 {
        self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coordinator(upgrade_cooldown: u64, downgrade_after: u64) -> Coordinator {
        Coordinator::new(Timing {
            upgrade_cooldown,
            downgrade_after,
        })
    }

    #[test]
    fn busy_signals_inside_the_cooldown_are_skipped() {
        let mut c = coordinator(10, 60);
        assert!(c.report_busy());
        for _ in 0..9 {
            assert!(!c.tick(1));
            assert!(!c.report_busy());
        }
        assert!(!c.tick(1));
        assert!(c.report_busy());
    }

    #[test]
    fn a_quiet_period_triggers_one_downgrade() {
        let mut c = coordinator(5, 10);
        assert!(c.report_busy());
        for tick in 1..=9 {
            assert!(!c.tick(1), "tick {tick}");
        }
        assert!(c.tick(1), "the 10th tick");
        assert!(!c.tick(100), "nothing left to undo");
    }

    #[test]
    fn a_skipped_busy_still_restarts_the_quiet_timer() {
        let mut c = coordinator(50, 10);
        assert!(c.report_busy());
        assert!(!c.tick(8));
        assert!(!c.report_busy(), "inside the cooldown");
        assert!(!c.tick(8), "quiet for 8 ticks only, not 16");
        assert!(c.tick(2));
    }

    #[test]
    fn each_quiet_period_undoes_one_more_level() {
        let mut c = coordinator(0, 10);
        assert!(c.report_busy());
        assert!(c.report_busy());
        assert_eq!(c.pending(), 2);
        assert!(c.tick(10));
        assert!(!c.tick(9));
        assert!(c.tick(1));
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn an_upgrade_that_changed_nothing_is_not_undone() {
        let mut c = coordinator(0, 10);
        assert!(c.report_busy());
        c.upgrade_skipped();
        assert!(!c.tick(1000));
    }

    #[test]
    fn huge_ticks_saturate() {
        let mut c = coordinator(10, 60);
        assert!(c.report_busy());
        assert!(c.tick((1 << 31) + 1000));
        assert!(!c.tick(u64::MAX));
        assert!(!c.tick(u64::MAX));
        assert!(c.report_busy());
        assert!(c.tick(u64::MAX));
    }
}
