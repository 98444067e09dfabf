package fleet

// validKey returns an error wrapping registry.ErrInvalidKey if key breaks
// the local registry's rule (registry.Registry.CheckKey, with the bound of
// registry.WithMaxKeyBytes among WithLocalOptions): the fleet checks it
// before anything goes to the store, so that a key is refused whether the
// store decides or the local registry alone does.
func (r *Registry[K]) validKey(key K) error { return r.local.CheckKey(key) }
