"""The settings of the agent and the topology service, by section (pydantic-settings).

Consumes: a YAML file, the ``LINKGUARD_*`` environment and explicit options. Produces: the
validated :class:`~linkguard.settings.agent.AgentSettings` and
:class:`~linkguard.settings.service.ServiceSettings`, made of the sections of
:mod:`~linkguard.settings.bus`, :mod:`~linkguard.settings.sections` and
:mod:`~linkguard.settings.servicesections`, loaded by
:func:`~linkguard.settings.loading.load_settings`. The old flat keys are moved into their
sections by :mod:`~linkguard.settings.deprecations`, with a
:class:`~linkguard.settings.base.DeprecatedSetting` warning. :mod:`linkguard.config` re-exports
all of it for its importers. Below every package built on the settings (the agent, the
service, the drivers, the simulations: an import-linter contract).
"""
