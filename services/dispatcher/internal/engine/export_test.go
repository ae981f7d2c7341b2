package engine

// ColdIn is how many cold tasks the partition counts in the queue of
// namespace and action, for the tests of the package engine_test.
func (p *Partition) ColdIn(namespace, action string) int { return p.cold[queueKey{namespace, action}] }
