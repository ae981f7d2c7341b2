package engine

// ColdIn is how many cold tasks the partition counts in the queue of
// namespace and action, for the tests of the package engine_test.
func (p *Partition) ColdIn(namespace, action string) int {
	if c := p.cold[queueKey{namespace, action}]; c != nil {
		return c.n
	}
	return 0
}
