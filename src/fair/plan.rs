//! Weighted max-min allocation by progressive filling (the `plan()`
//! yardstick, D24).
//!
//! # Algorithm
//!
//! Raise one water level `λ` for all unsatisfied tenants at once, each
//! tenant receiving `λ × weight`. When the remaining capacity divided by the
//! unsatisfied weight would carry some tenant past its demand, those tenants
//! are frozen at exactly their demand, their allocation is subtracted from
//! the remaining capacity, and the level is recomputed for the others.
//! When no tenant saturates, the rest is split by weight and filling stops.
//! At most one round per tenant, so `O(n²)`.
//!
//! The result is never above a tenant's demand, sums to at most the ceiling,
//! and leaves capacity unallocated only when every demand is met (P5).

use super::admission::TOLERANCE;

/// Weighted max-min allocation of `ceiling` over `(weight, demand)` pairs,
/// in input order. Demands may be `f64::INFINITY`.
///
/// Bad input never panics: a non-positive or non-finite ceiling allocates
/// nothing; a tenant with a non-positive or NaN weight, or a non-positive or
/// NaN demand, gets 0.
///
/// ```
/// use shmsched::fair::plan_allocation;
/// assert_eq!(plan_allocation(100.0, &[(1.0, 30.0), (1.0, 100.0)]), vec![30.0, 70.0]);
/// assert_eq!(plan_allocation(100.0, &[(1.0, 10.0), (2.0, 100.0), (1.0, 100.0)]), vec![10.0, 60.0, 30.0]);
/// ```
pub fn plan_allocation(ceiling: f64, tenants: &[(f64, f64)]) -> Vec<f64> {
    let mut alloc = vec![0.0; tenants.len()];
    if !(ceiling.is_finite() && ceiling > 0.0) {
        return alloc;
    }
    let valid = |w: f64, d: f64| w.is_finite() && w > 0.0 && d > 0.0;
    let mut active: Vec<usize> = (0..tenants.len())
        .filter(|&i| valid(tenants[i].0, tenants[i].1))
        .collect();
    let mut remaining = ceiling;
    while !active.is_empty() && remaining > TOLERANCE {
        let wsum: f64 = active.iter().map(|&i| tenants[i].0).sum();
        let level = remaining / wsum;
        let (sat, unsat): (Vec<usize>, Vec<usize>) = active
            .iter()
            .partition(|&&i| tenants[i].1 <= level * tenants[i].0 + TOLERANCE);
        if sat.is_empty() {
            for &i in &active {
                alloc[i] = level * tenants[i].0;
            }
            break;
        }
        for &i in &sat {
            alloc[i] = tenants[i].1;
            remaining = (remaining - tenants[i].1).max(0.0);
        }
        active = unsat;
    }
    alloc
}

#[cfg(test)]
mod tests {
    use super::plan_allocation;

    #[test]
    fn p1_to_p5() {
        assert_eq!(
            plan_allocation(100.0, &[(1.0, 30.0), (1.0, 100.0)]),
            vec![30.0, 70.0]
        );
        assert_eq!(
            plan_allocation(100_000.0, &[(3.0, f64::INFINITY), (1.0, f64::INFINITY)]),
            vec![75_000.0, 25_000.0]
        );
        assert_eq!(
            plan_allocation(100.0, &[(1.0, 10.0), (2.0, 100.0), (1.0, 100.0)]),
            vec![10.0, 60.0, 30.0]
        );
        assert_eq!(
            plan_allocation(100.0, &[(1.0, 5.0), (1.0, 15.0), (1.0, 40.0), (1.0, 100.0)]),
            vec![5.0, 15.0, 40.0, 40.0]
        );
        assert_eq!(
            plan_allocation(100.0, &[(1.0, 20.0), (1.0, 30.0)]),
            vec![20.0, 30.0]
        );
    }

    #[test]
    fn bad_input_is_zero_not_panic() {
        assert_eq!(plan_allocation(f64::NAN, &[(1.0, 1.0)]), vec![0.0]);
        assert_eq!(
            plan_allocation(
                10.0,
                &[(0.0, 5.0), (f64::NAN, 5.0), (1.0, f64::NAN), (1.0, 50.0)]
            ),
            vec![0.0, 0.0, 0.0, 10.0]
        );
        assert!(plan_allocation(10.0, &[]).is_empty());
    }
}
