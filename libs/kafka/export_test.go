package kafka

// Reading reports whether a tail reading on demand reads now.
func (t *Tail) Reading() bool {
	t.demand.mu.Lock()
	defer t.demand.mu.Unlock()
	return t.demand.reading != nil
}
