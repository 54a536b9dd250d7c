"""The paper's layer: its tables (layouts, selection, rendering), the published numbers they are compared with,
the statistics behind their marks, its figures, and the sweep that plans a table's runs from stored records.
"""
