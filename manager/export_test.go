package manager

// CreationsInFlight is how many creations have started and not ended: a test whose allocator
// blocks in Create reads whether a reconcile pass started one, without waiting to see.
func (m *Manager) CreationsInFlight() int { return m.creations.count() }
