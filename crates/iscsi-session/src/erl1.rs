//! What a SNACK asks for again (ErrorRecoveryLevel 1, RFC 7143 §11.16): a run of numbered
//! PDUs — StatSNs for a Status SNACK, a task's DataSNs or R2TSNs for a Data/R2T SNACK —
//! from BegRun, RunLength of them (0: all from BegRun on). A run that reaches past what
//! was sent, or back to what was already acknowledged, is refused: the target answers with
//! a Reject (reason Protocol Error) instead of resending anything.

/// SNACK types (the low four bits of byte 1).
pub mod snack_type {
    pub const DATA_R2T: u8 = 0;
    pub const STATUS: u8 = 1;
    pub const DATA_ACK: u8 = 2;
    pub const R_DATA: u8 = 3;
}

/// Why a SNACK's run cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnackRefused {
    #[error(
        "SNACK asks for {beg_run}+{run_length}, but only numbers {first}..{next} are retained"
    )]
    OutsideRetained {
        beg_run: u32,
        run_length: u32,
        first: u32,
        next: u32,
    },
}

/// The numbers a SNACK run covers, given that `first..next` (serial arithmetic, so a
/// StatSN run may wrap) are the ones sent and still retained. Returns them in order.
/// BegRun and RunLength both 0 ask for everything retained.
pub fn snack_run(
    beg_run: u32,
    run_length: u32,
    first: u32,
    next: u32,
) -> Result<impl Iterator<Item = u32>, SnackRefused> {
    let beg_run = if beg_run == 0 && run_length == 0 {
        first
    } else {
        beg_run
    };
    let retained = next.wrapping_sub(first);
    let offset = beg_run.wrapping_sub(first);
    let count = if run_length == 0 {
        retained.wrapping_sub(offset)
    } else {
        run_length
    };
    let fits = retained < 1 << 31
        && offset < retained
        && count >= 1
        && offset as u64 + count as u64 <= retained as u64;
    if !fits {
        return Err(SnackRefused::OutsideRetained {
            beg_run,
            run_length,
            first,
            next,
        });
    }
    Ok((0..count).map(move |i| beg_run.wrapping_add(i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(beg: u32, len: u32, first: u32, next: u32) -> Option<Vec<u32>> {
        snack_run(beg, len, first, next).ok().map(|r| r.collect())
    }

    #[test]
    fn runs_within_what_was_sent() {
        assert_eq!(run(2, 2, 0, 5), Some(vec![2, 3]));
        assert_eq!(
            run(2, 0, 0, 5),
            Some(vec![2, 3, 4]),
            "RunLength 0: to the end"
        );
        assert_eq!(run(0, 0, 0, 1), Some(vec![0]));
        assert_eq!(
            run(u32::MAX, 0, u32::MAX - 1, 2),
            Some(vec![u32::MAX, 0, 1]),
            "wrap"
        );
        assert_eq!(run(0, 0, 7, 9), Some(vec![7, 8]), "0 and 0: all retained");
    }

    #[test]
    fn runs_outside_are_refused() {
        assert_eq!(run(5, 1, 0, 5), None, "not sent yet");
        assert_eq!(run(3, 3, 0, 5), None, "runs past the end");
        assert_eq!(run(1, 1, 2, 5), None, "already acknowledged");
        assert_eq!(run(0, 0, 0, 0), None, "nothing sent");
        assert_eq!(run(0, 1, 7, 7), None);
    }
}
