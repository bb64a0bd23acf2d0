//! [`Few`]: a list that keeps its first item inline, for the short lists
//! a hot path builds and drops on every call (the wake-ups of one release,
//! the levels a waiter came through: almost always one), so that the
//! common case allocates nothing.

/// A list whose first item lives inline and the rest in a `Vec` (which
/// allocates only from the second item on).
#[derive(Debug)]
pub(crate) struct Few<T> {
    first: Option<T>,
    more: Vec<T>,
}

impl<T: Clone> Clone for Few<T> {
    fn clone(&self) -> Few<T> {
        Few {
            first: self.first.clone(),
            more: self.more.clone(),
        }
    }
}

impl<T> Default for Few<T> {
    fn default() -> Few<T> {
        Few {
            first: None,
            more: Vec::new(),
        }
    }
}

impl<T> Few<T> {
    /// Appends `t`.
    #[inline]
    pub(crate) fn push(&mut self, t: T) {
        if self.first.is_none() {
            self.first = Some(t);
        } else {
            self.more.push(t);
        }
    }

    /// The items, first to last.
    #[inline]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + Clone {
        self.first.iter().chain(self.more.iter())
    }

    /// Takes the items out, first to last, leaving the list empty (an
    /// empty rest costs nothing to take).
    #[inline]
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> {
        self.first
            .take()
            .into_iter()
            .chain(std::mem::take(&mut self.more))
    }

    /// Empties the list.
    #[inline]
    pub(crate) fn clear(&mut self) {
        self.first = None;
        self.more.clear();
    }

    /// True if `t` is in the list.
    #[inline]
    pub(crate) fn contains(&self, t: &T) -> bool
    where
        T: PartialEq,
    {
        self.iter().any(|x| x == t)
    }

    /// True if nothing was pushed (or everything was drained).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none() && self.more.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::Few;

    #[test]
    fn keeps_the_order_and_empties_on_drain() {
        let mut f = Few::default();
        assert!(f.is_empty());
        for i in 0..5 {
            f.push(i);
        }
        assert_eq!(f.iter().copied().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert_eq!(f.drain().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert!(f.is_empty());
        f.push(7);
        assert_eq!(f.drain().collect::<Vec<_>>(), [7]);
        assert!(f.is_empty());
        f.push(1);
        f.push(2);
        let g = f.clone();
        assert!(g.contains(&2) && !g.contains(&3));
        f.clear();
        assert!(f.is_empty() && !g.is_empty());
    }

    #[test]
    fn one_item_allocates_nothing() {
        let mut f = Few::default();
        f.push(String::from("a"));
        assert_eq!(f.more.capacity(), 0);
        f.push(String::from("b"));
        assert!(f.more.capacity() >= 1);
    }
}
